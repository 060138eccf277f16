package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"mime"
	"net/http"
	"strconv"
	"strings"

	"nvpair-workload-manager/internal/httpguard"
	"nvpair-workload-manager/internal/wireframe"
)

// The peer port's batch wire format: the advertisement, the request and the
// per-element answer. A batch carries several frames in one request, so a
// sender with a backlog pays one round trip for many frames instead of one
// each. It is negotiated: a node says on every answer of its peer port what
// batches it takes, and a sender sends batches only to a peer whose answers
// said so. A stock daemon never advertises, so it is only ever sent the
// single frames it has always understood, and it sees exactly what it saw
// before batches existed.

// peerBatchHeader is the response header of the advertisement.
const peerBatchHeader = "Nvpair-Wl-Batch"

// peerBatchContentType marks a request as a batch: one frame per line. A
// stock sender posts application/json, so its requests stay single frames.
const peerBatchContentType = "application/x-ndjson"

const (
	// peerBatchMaxFrames bounds the elements of one batch, and with them the
	// answer: it holds one result per element, and a result's reason is
	// clipped, so the answer stays under half a megabyte. It also bounds
	// how long one request holds the sender's connection, as the elements
	// are written to the broker one after the other.
	peerBatchMaxFrames = 256
	// peerBatchMaxBytes bounds a batch's body. It is the bound a single
	// frame's body already has, for two reasons: a batch then costs the
	// receiver no more memory, and no more read time under the server's
	// read timeout, than a single request always could; and every frame that
	// may be sent alone fits in a batch of its own, so a sender never needs
	// a separate rule for a frame too large to batch.
	peerBatchMaxBytes = wireframe.MaxBytes
)

// peerBatchAdvert is this node's advertisement, sent on every answer of its
// peer port.
var peerBatchAdvert = formatBatchAdvert(peerBatchMaxFrames, peerBatchMaxBytes)

// peerBatchAdvertValue is the header's value, shared by every answer
// (httpserve.go says why sharing is safe).
var peerBatchAdvertValue = []string{peerBatchAdvert}

// formatBatchAdvert renders an advertisement: the most elements, and the
// most body bytes, a batch may have.
func formatBatchAdvert(maxFrames, maxBytes int) string {
	return "max-frames=" + strconv.Itoa(maxFrames) + ", max-bytes=" + strconv.Itoa(maxBytes)
}

// parseBatchAdvert reads an advertisement, the value of a peer's
// Nvpair-Wl-Batch header. It is a comma-separated list of name=value
// parameters; names are compared without regard to case, whitespace around
// elements, names and values is ignored, as are empty elements, and
// parameters it does not know are skipped, so a later version may add some
// without confusing this one. Both max-frames and max-bytes must be present,
// once each, as positive decimal integers; otherwise ok is false and the
// peer must be treated as taking no batches: a sender that guessed would
// send a stock daemon a request it cannot read.
func parseBatchAdvert(h string) (maxFrames, maxBytes int, ok bool) {
	for _, param := range strings.Split(h, ",") {
		param = strings.Trim(param, " \t")
		if param == "" {
			continue
		}
		name, value, _ := strings.Cut(param, "=")
		var dst *int
		switch strings.ToLower(strings.Trim(name, " \t")) {
		case "max-frames":
			dst = &maxFrames
		case "max-bytes":
			dst = &maxBytes
		default:
			continue
		}
		n, valid := positiveDecimal(strings.Trim(value, " \t"))
		if !valid || *dst != 0 {
			// A bad value, or a second one: the advertisement is not
			// clear, and batches are only sent on a clear one.
			return 0, 0, false
		}
		*dst = n
	}
	if maxFrames == 0 || maxBytes == 0 {
		return 0, 0, false
	}
	return maxFrames, maxBytes, true
}

// positiveDecimal parses digits only (no sign, no space) into an int > 0.
func positiveDecimal(s string) (int, bool) {
	if s == "" || strings.TrimLeft(s, "0123456789") != "" {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	return n, err == nil && n > 0
}

// peerBatchAnswer is the body of the answer to a batch that was processed:
// one result per element, in the order of the elements.
type peerBatchAnswer struct {
	Results []peerBatchResult `json:"results"`
}

// peerBatchResult is what became of one element: the status a single
// request carrying it would have been answered with (200, 400, 413, 500),
// or 503 for an element not attempted because an earlier one failed. The
// reason is empty for an element written; it is reasonAlreadySeen for a
// duplicate.
type peerBatchResult struct {
	Status int    `json:"status"`
	Reason string `json:"reason,omitempty"`
}

// Reasons of the results the batch code decides by itself.
const (
	reasonNotAttempted = "not attempted: an earlier element failed"
	reasonEmptyElement = "empty element"
)

// Whole-batch refusals, found before any element is looked at.
var (
	errEmptyBatch         = errors.New("empty batch")
	errBatchTooManyFrames = fmt.Errorf("batch of more than %d frames", peerBatchMaxFrames)
)

// isPeerBatch reports whether a request is a batch, by its Content-Type.
func isPeerBatch(r *http.Request) bool {
	ct := r.Header.Get("Content-Type")
	if ct == "application/json" {
		return false // a single frame, as every stock peer sends it, without a parse
	}
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && mt == peerBatchContentType
}

// splitPeerBatch cuts a batch's body into its elements, one per line. A
// final line without its newline is an element; a final newline does not
// start one. The lines are counted before any is cut out, so a body of a
// million newlines costs one pass and no allocation before it is refused.
func splitPeerBatch(body []byte) ([][]byte, error) {
	if len(body) == 0 {
		return nil, errEmptyBatch
	}
	n := bytes.Count(body, []byte("\n"))
	if body[len(body)-1] != '\n' {
		n++
	}
	if n > peerBatchMaxFrames {
		return nil, errBatchTooManyFrames
	}
	return bytes.SplitN(bytes.TrimSuffix(body, []byte("\n")), []byte("\n"), n), nil
}

// runPeerBatch handles the elements in order, each by handle as if it had
// arrived alone, and returns their results. At the first failure of the
// broker write (a 5xx) it stops: every later element is answered 503 and
// never handed to handle. A sender that retries the failed element and
// everything after it, in order, then never has a later event applied
// before an earlier one.
func runPeerBatch(elems [][]byte, handle func([]byte) (status int, reason string)) []peerBatchResult {
	results := make([]peerBatchResult, len(elems))
	failed := false
	for i, e := range elems {
		switch {
		case failed:
			results[i] = peerBatchResult{http.StatusServiceUnavailable, reasonNotAttempted}
		case len(bytes.Trim(e, " \t\r")) == 0:
			// An empty line is an element, so that result i is always line
			// i; it cannot be a frame.
			results[i] = peerBatchResult{http.StatusBadRequest, reasonEmptyElement}
		default:
			status, reason := handle(e)
			results[i] = peerBatchResult{status, httpguard.ClipReason(reason)}
			failed = status >= http.StatusInternalServerError
		}
	}
	return results
}

// servePeerBatch handles a batch whose sender passed the checks that need
// no body (servePeer). The body's bounds are checked before any element is
// looked at, so a batch over them is refused whole and nothing of it is
// written. A batch that was processed is answered 200 with one result per
// element, whatever those results are.
func (m *Manager) servePeerBatch(w http.ResponseWriter, r *http.Request, log *httpguard.RequestLog, principal string, reject func(status int, reason string)) {
	body, release, err := m.bodies.Peer.ReadBody(w, r, peerBatchMaxBytes)
	if err != nil {
		status, reason := httpguard.BodyRefusal(w, err)
		if status == http.StatusRequestEntityTooLarge {
			reason = "batch " + reason
		}
		reject(status, reason)
		return
	}
	defer release()
	elems, err := splitPeerBatch(body)
	if errors.Is(err, errBatchTooManyFrames) {
		reject(http.StatusRequestEntityTooLarge, err.Error())
		return
	}
	if err != nil {
		reject(http.StatusBadRequest, err.Error())
		return
	}
	// A batch is one request waiting on the broker, whatever its length: it
	// takes one slot for all its elements, which it writes one at a time.
	if !m.peerWaiters.acquire(r.Context().Done()) {
		m.peerWaiters.refuse(w, log.Logger())
		return
	}
	m.batchesReceived.Add(1)
	m.batchFramesReceived.Add(uint64(len(elems)))
	results := runPeerBatch(elems, func(b []byte) (int, string) { return m.handlePeerFrame(log, principal, b) })
	m.peerWaiters.release()
	logPeerBatch(log, results)
	b, err := json.Marshal(peerBatchAnswer{Results: results})
	if err != nil {
		// Ints and strings always marshal; this is not reached.
		log.Logger().Error("peer batch answer not encoded", "reason", err)
		httpguard.Answer(w, http.StatusInternalServerError, "answer not encoded")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	w.Write(append(b, '\n'))
}

// logPeerBatch logs a batch in one line, never one per element: a sender
// with a bad element in every batch would otherwise fill the log 256 lines
// at a time. Rejected and unattempted elements make it a warning naming the
// first of them; a failed broker write was already logged at error, and a
// refusal for origin, rate-limited, by handlePeerFrame: alone, those
// leave the batch's line at debug.
func logPeerBatch(log *httpguard.RequestLog, results []peerBatchResult) {
	var ok, rejected, notAttempted, originRefused int
	first := -1
	for i, res := range results {
		switch {
		case res.Status == http.StatusOK:
			ok++
		case isOriginRefusal(res.Status, res.Reason):
			originRefused++
			continue
		case res.Status == http.StatusServiceUnavailable:
			notAttempted++
		case res.Status < http.StatusInternalServerError:
			rejected++
		}
		if res.Status != http.StatusOK && first < 0 {
			first = i
		}
	}
	if first < 0 {
		if log.Enabled(slog.LevelDebug) {
			log.Logger().Debug("peer batch accepted", "elements", len(results), "originRefused", originRefused)
		}
		return
	}
	log.Logger().Warn("peer batch elements rejected", "elements", len(results), "ok", ok,
		"rejected", rejected, "notAttempted", notAttempted, "originRefused", originRefused, "firstIndex", first,
		"status", results[first].Status, "reason", results[first].Reason)
}
