// Package ingressmark owns the value of the ingress mark (spec 3.5.3): the
// proof, in the workload object of each ingress frame the daemon writes to
// its broker, that this node's ingress wrote it, for which run, and under
// which lease. PAIR's broker stores the object whole and replays it to a
// restarted daemon, so after a crash between the broker write and the
// journal the replay still says the job is a producer's.
//
// A mark is an HMAC-SHA256 of the run's key and the lease, under a key
// only this node holds (the app dir's workload-manager.ingress-key,
// internal/pairinstall): a mark copied onto another job, a lease changed,
// or a mark another node or a proxy wrote, does not check. The mark's
// member name, and cutting it out of a frame, are the frame format's
// (internal/wireframe).
//
// It imports nothing of this module but internal/wireframe, and never
// net/http: it is a few bytes in, a few bytes out.
package ingressmark

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"hash"
	"strconv"
	"sync"

	"nvpair-workload-manager/internal/wireframe"
)

// MinKeyBytes is the shortest key a Marker takes: 128 bits, what the
// truncated MAC holds.
const MinKeyBytes = 16

// macBytes is the MAC's length in a mark: 128 bits, as many as a guess
// must match. Its base64 form is 22 characters.
const macBytes = 16

// maxLeaseDigits bounds the lease's text in a mark: 86400 has five digits.
const maxLeaseDigits = 6

// MaxMemberBytes is the most bytes a mark's member adds to a workload
// object: the comma, the quoted name, the colon and the quoted value (a
// lease of up to six digits, a dot and the MAC). The broker line has to
// have room for it (the daemon leaves it out of a line that would not fit
// with it).
const MaxMemberBytes = 1 + len(`"`+wireframe.IngressMarkName+`":`) + 2 + maxLeaseDigits + 1 + 22

// Marker makes and checks the marks of one node. It keeps no state but
// its key (and keyed MACs to reuse) and is safe for concurrent use.
type Marker struct {
	key []byte
	// macs recycles keyed HMACs with their message buffer: a mark is made
	// for every ingress frame, and a fresh HMAC costs its key's two
	// blocks and a dozen allocations, where a reset one costs neither.
	macs sync.Pool
}

// macState is one keyed HMAC and the buffer its message is built in.
type macState struct {
	h   hash.Hash
	msg []byte
	sum [sha256.Size]byte
}

// New returns the Marker of key (at least MinKeyBytes).
func New(key []byte) (*Marker, error) {
	if len(key) < MinKeyBytes {
		return nil, errors.New("ingress mark key: shorter than 16 bytes")
	}
	m := &Marker{key: bytes.Clone(key)}
	m.macs.New = func() any { return &macState{h: hmac.New(sha256.New, m.key)} }
	return m, nil
}

// Member returns the mark of run k under a lease of leaseSeconds (0: no
// lease) as the member the broker line's workload object ends with,
// `"wlmIngress":"<lease>.<mac>"`, without the comma before it.
func (m *Marker) Member(k wireframe.WorkloadKey, leaseSeconds int) []byte {
	lease := strconv.Itoa(leaseSeconds)
	b := make([]byte, 0, MaxMemberBytes)
	b = append(b, `"`+wireframe.IngressMarkName+`":"`...)
	b = append(b, lease...)
	b = append(b, '.')
	st := m.macs.Get().(*macState)
	b = base64.RawURLEncoding.AppendEncode(b, m.mac(st, k, lease))
	m.macs.Put(st)
	return append(b, '"')
}

// Check reads a mark's value (the JSON token of the member) for run k:
// ok when this node's key made it for that run, with the lease it was
// made under. A value of another form, another key or another run is not
// ok.
func (m *Marker) Check(value []byte, k wireframe.WorkloadKey) (leaseSeconds int, ok bool) {
	if len(value) < 2 || value[0] != '"' || value[len(value)-1] != '"' {
		return 0, false
	}
	lease, sum, found := bytes.Cut(value[1:len(value)-1], []byte{'.'})
	if !found || !plainDecimal(lease) {
		return 0, false
	}
	got, err := base64.RawURLEncoding.Strict().DecodeString(string(sum))
	if err != nil {
		return 0, false
	}
	st := m.macs.Get().(*macState)
	same := hmac.Equal(got, m.mac(st, k, string(lease)))
	m.macs.Put(st)
	if !same {
		return 0, false
	}
	n, _ := strconv.Atoi(string(lease)) // plainDecimal: at most six digits
	return n, true
}

// plainDecimal reports whether b is a decimal number as strconv.Itoa
// writes one of at most maxLeaseDigits digits: the text the MAC was made
// over, and no other spelling of it.
func plainDecimal(b []byte) bool {
	if len(b) == 0 || len(b) > maxLeaseDigits || (b[0] == '0' && len(b) > 1) {
		return false
	}
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// macDomain opens every message the MAC is made over, so a MAC of this
// key made for anything else never checks as a mark.
const macDomain = "nvpair-workload-manager ingress mark v1"

// mac is the truncated HMAC-SHA256 of the run's key and the lease's text,
// each field prefixed with its length: no two keys write the same message.
// It is made with st's keyed HMAC, reset, and is valid until st is used
// again.
func (m *Marker) mac(st *macState, k wireframe.WorkloadKey, lease string) []byte {
	msg := st.msg[:0]
	for _, f := range [...]string{macDomain, k.Origin, k.Engine, k.RunID, k.ID, lease} {
		msg = binary.AppendUvarint(msg, uint64(len(f)))
		msg = append(msg, f...)
	}
	st.msg = msg
	st.h.Reset()
	st.h.Write(msg)
	return st.h.Sum(st.sum[:0])[:macBytes]
}
