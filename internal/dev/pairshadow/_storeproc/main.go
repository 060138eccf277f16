// Command storeproc drives PAIR's broker workload store
// (nvpair-ui-broker/workloadstore, from ../shared) the way PAIR's broker
// drives it, one JSON command a line on stdin, so that the model in
// internal/dev/pairbroker can be judged by the real thing. It is built on the
// fly by internal/dev/pairshadow, never by the root module: the root module
// requires nothing, and this program needs PAIR's module.
//
// Every command carries the instant to run at ("now", Unix nanoseconds),
// which the store's clock is set to first. Only "snapshot" and "replay"
// answer, one line each; the others are applied in order and answer
// nothing, so a caller can stream them.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"nvpair-ui-broker/workloadstore"
)

type command struct {
	Op         string          `json:"op"`
	Now        int64           `json:"now"`
	Info       json.RawMessage `json:"info"`
	Origin     string          `json:"origin"`
	ID         string          `json:"id"`
	Node       string          `json:"node"`
	Reason     string          `json:"reason"`
	StaleAfter int64           `json:"staleAfter"` // nanoseconds
	WindowMs   int64           `json:"windowMs"`
}

type answer struct {
	Infos []json.RawMessage `json:"infos"`
	Error string            `json:"error,omitempty"`
}

func main() {
	var now time.Time
	s := newStore(&now)
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 64<<20)
	out := bufio.NewWriter(os.Stdout)
	enc := json.NewEncoder(out)
	for in.Scan() {
		var c command
		if err := json.Unmarshal(in.Bytes(), &c); err != nil {
			fmt.Fprintf(os.Stderr, "storeproc: bad command: %v\n", err)
			os.Exit(2)
		}
		now = time.Unix(0, c.Now)
		if c.Op == "reset" {
			// A new empty store: a property test runs many sequences on
			// one program.
			s = newStore(&now)
			continue
		}
		if a, ok := run(s, c, now); ok {
			enc.Encode(a)
			out.Flush()
		}
	}
}

// newStore returns an empty store whose clock reads *now.
func newStore(now *time.Time) *workloadstore.Store {
	s := workloadstore.New()
	s.SetClock(func() time.Time { return *now })
	return s
}

// run applies one command; it reports true with the answer of a query.
func run(s *workloadstore.Store, c command, now time.Time) (answer, bool) {
	switch c.Op {
	case "upsert":
		// The broker's workloads:upsert: ParseIncoming, then Apply; a
		// payload ParseIncoming refuses is dropped.
		if in, ok := workloadstore.ParseIncoming(c.Info); ok {
			s.Apply(in)
		}
	case "remove":
		s.Remove(c.Origin, c.ID)
	case "failnode":
		// A node leaving discovery: its live records (ActiveForNode),
		// each merged as an inferred failure.
		for _, r := range s.ActiveForNode(c.Node) {
			if in, ok := failed(r, c.Reason, now); ok {
				s.ApplyInferred(in)
			}
		}
	case "sweep":
		// The staleness sweep: StaleForeign, then each guess merged only
		// if the origin has said nothing since the sighting it was based on.
		for _, r := range s.StaleForeign(c.Node, time.Duration(c.StaleAfter)) {
			if in, ok := failed(r, c.Reason, now); ok {
				s.ApplyInferredUnchangedSince(in, r.LastSeen)
			}
		}
	case "snapshot":
		return answer{Infos: orEmpty(s.Snapshot())}, true
	case "replay":
		var infos []json.RawMessage
		for _, r := range s.ReplayForNode(c.Node, c.WindowMs) {
			infos = append(infos, r.Info)
		}
		return answer{Infos: orEmpty(infos)}, true
	default:
		return answer{Error: "unknown op " + c.Op}, true
	}
	return answer{}, false
}

// failed is the guess that r failed: its workload object with state
// failed, completedAt now and reason as its error, written exactly as
// internal/dev/pairbroker writes it, so that both stores hold the same bytes.
func failed(r workloadstore.Record, reason string, now time.Time) (workloadstore.Incoming, bool) {
	var members map[string]json.RawMessage
	if err := json.Unmarshal(r.Info, &members); err != nil {
		members = map[string]json.RawMessage{}
	}
	members["state"] = json.RawMessage(`"failed"`)
	members["completedAt"], _ = json.Marshal(now.UnixMilli())
	members["error"], _ = json.Marshal(reason)
	info, err := json.Marshal(members)
	if err != nil {
		return workloadstore.Incoming{}, false
	}
	return workloadstore.ParseIncoming(info)
}

func orEmpty(infos []json.RawMessage) []json.RawMessage {
	if infos == nil {
		return []json.RawMessage{}
	}
	return infos
}
