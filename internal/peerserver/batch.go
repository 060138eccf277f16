package peerserver

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"

	"nvpair-workload-manager/internal/httpguard"
	"nvpair-workload-manager/internal/peerwire"
)

// servePeerBatch handles a batch whose sender passed the checks that need
// no body (ServeHTTP). The body's bounds are checked before any element is
// looked at, so a batch over them is refused whole and nothing of it is
// written. A batch that was processed is answered 200 with one result per
// element, whatever those results are.
func (s *Server) servePeerBatch(w http.ResponseWriter, r *http.Request, log *httpguard.RequestLog, principal string, reject func(status int, reason string)) {
	body, hold, err := s.cfg.Bodies.ReadBody(w, r, peerwire.BatchMaxBytes)
	if err != nil {
		status, reason := httpguard.BodyRefusal(w, err)
		if status == http.StatusRequestEntityTooLarge {
			reason = "batch " + reason
		}
		reject(status, reason)
		return
	}
	defer hold.Release()
	elems, err := peerwire.SplitBatch(body)
	if errors.Is(err, peerwire.ErrBatchTooManyFrames) {
		reject(http.StatusRequestEntityTooLarge, err.Error())
		return
	}
	if err != nil {
		reject(http.StatusBadRequest, err.Error())
		return
	}
	// A batch is one request waiting on the broker, whatever its length: it
	// takes one slot for all its elements, which it writes one at a time.
	if !s.cfg.Waiters.Acquire(r.Context()) {
		s.cfg.Waiters.Refuse(w, log.Logger())
		return
	}
	s.batchesReceived.Add(1)
	s.batchFramesReceived.Add(uint64(len(elems)))
	results := peerwire.RunBatch(elems, func(b []byte) (int, string) { return s.HandleFrame(log, principal, b) })
	s.cfg.Waiters.Release()
	logPeerBatch(log, results)
	b, err := json.Marshal(peerwire.BatchAnswer{Results: results})
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
// refusal for origin, rate-limited, by HandleFrame: alone, those
// leave the batch's line at debug.
func logPeerBatch(log *httpguard.RequestLog, results []peerwire.BatchResult) {
	var ok, rejected, notAttempted, originRefused int
	first := -1
	for i, res := range results {
		switch {
		case res.Status == http.StatusOK:
			ok++
		case peerwire.IsOriginRefusal(res.Status, res.Reason):
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
