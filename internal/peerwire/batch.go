package peerwire

import (
	"bytes"
	"errors"
	"fmt"
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

// BatchHeader is the response header of the advertisement.
const BatchHeader = "Nvpair-Wl-Batch"

// BatchContentType marks a request as a batch: one frame per line. A
// stock sender posts application/json, so its requests stay single frames.
const BatchContentType = "application/x-ndjson"

const (
	// BatchMaxFrames bounds the elements of one batch, and with them the
	// answer: it holds one result per element, and a result's reason is
	// clipped, so the answer stays under half a megabyte. It also bounds
	// how long one request holds the sender's connection, as the elements
	// are written to the broker one after the other.
	BatchMaxFrames = 256
	// BatchMaxBytes bounds a batch's body. It is the bound a single
	// frame's body already has, for two reasons: a batch then costs the
	// receiver no more memory, and no more read time under the server's
	// read timeout, than a single request always could; and every frame that
	// may be sent alone fits in a batch of its own, so a sender never needs
	// a separate rule for a frame too large to batch.
	BatchMaxBytes = wireframe.MaxBytes
)

// BatchAdvert is this node's advertisement, sent on every answer of its
// peer port.
var BatchAdvert = FormatBatchAdvert(BatchMaxFrames, BatchMaxBytes)

// BatchAdvertValue is the header's value, shared by every answer
// (internal/httpguard/httpserve.go says why sharing is safe).
var BatchAdvertValue = []string{BatchAdvert}

// FormatBatchAdvert renders an advertisement: the most elements, and the
// most body bytes, a batch may have.
func FormatBatchAdvert(maxFrames, maxBytes int) string {
	return "max-frames=" + strconv.Itoa(maxFrames) + ", max-bytes=" + strconv.Itoa(maxBytes)
}

// ParseBatchAdvert reads an advertisement, the value of a peer's
// Nvpair-Wl-Batch header. It is a comma-separated list of name=value
// parameters; names are compared without regard to case, whitespace around
// elements, names and values is ignored, as are empty elements, and
// parameters it does not know are skipped, so a later version may add some
// without confusing this one. Both max-frames and max-bytes must be present,
// once each, as positive decimal integers; otherwise ok is false and the
// peer must be treated as taking no batches: a sender that guessed would
// send a stock daemon a request it cannot read.
func ParseBatchAdvert(h string) (maxFrames, maxBytes int, ok bool) {
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

// BatchAnswer is the body of the answer to a batch that was processed:
// one result per element, in the order of the elements.
type BatchAnswer struct {
	Results []BatchResult `json:"results"`
}

// BatchResult is what became of one element: the status a single
// request carrying it would have been answered with (200, 400, 413, 500),
// or 503 for an element not attempted because an earlier one failed. The
// reason is empty for an element written; it is ReasonAlreadySeen for a
// duplicate.
type BatchResult struct {
	Status int    `json:"status"`
	Reason string `json:"reason,omitempty"`
}

// Reasons of the results the batch code decides by itself.
const (
	ReasonNotAttempted = "not attempted: an earlier element failed"
	ReasonEmptyElement = "empty element"
)

// Whole-batch refusals, found before any element is looked at.
var (
	ErrEmptyBatch         = errors.New("empty batch")
	ErrBatchTooManyFrames = fmt.Errorf("batch of more than %d frames", BatchMaxFrames)
)

// IsBatch reports whether a request is a batch, by its Content-Type.
func IsBatch(r *http.Request) bool {
	ct := r.Header.Get("Content-Type")
	if ct == "application/json" {
		return false // a single frame, as every stock peer sends it, without a parse
	}
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && mt == BatchContentType
}

// SplitBatch cuts a batch's body into its elements, one per line. A
// final line without its newline is an element; a final newline does not
// start one. The lines are counted before any is cut out, so a body of a
// million newlines costs one pass and no allocation before it is refused.
func SplitBatch(body []byte) ([][]byte, error) {
	if len(body) == 0 {
		return nil, ErrEmptyBatch
	}
	n := bytes.Count(body, []byte("\n"))
	if body[len(body)-1] != '\n' {
		n++
	}
	if n > BatchMaxFrames {
		return nil, ErrBatchTooManyFrames
	}
	return bytes.SplitN(bytes.TrimSuffix(body, []byte("\n")), []byte("\n"), n), nil
}

// RunBatch handles the elements in order, each by handle as if it had
// arrived alone, and returns their results. At the first failure of the
// broker write (a 5xx) it stops: every later element is answered 503 and
// never handed to handle. A sender that retries the failed element and
// everything after it, in order, then never has a later event applied
// before an earlier one.
func RunBatch(elems [][]byte, handle func([]byte) (status int, reason string)) []BatchResult {
	results := make([]BatchResult, len(elems))
	failed := false
	for i, e := range elems {
		switch {
		case failed:
			results[i] = BatchResult{http.StatusServiceUnavailable, ReasonNotAttempted}
		case len(bytes.Trim(e, " \t\r")) == 0:
			// An empty line is an element, so that result i is always line
			// i; it cannot be a frame.
			results[i] = BatchResult{http.StatusBadRequest, ReasonEmptyElement}
		default:
			status, reason := handle(e)
			results[i] = BatchResult{status, httpguard.ClipReason(reason)}
			failed = status >= http.StatusInternalServerError
		}
	}
	return results
}
