package wireframe

import (
	"errors"
	"fmt"
	"sort"
)

// ForeignOriginError is an ingress frame whose originatedFrom names
// another node than this one (or any of its aliases).
type ForeignOriginError struct {
	Origin string
}

func (e *ForeignOriginError) Error() string {
	return fmt.Sprintf("originatedFrom %q is not this node: a producer reports only workloads that run here", e.Origin)
}

// ParseIngressAs is ParseIngress for a node known by other ids too: the
// id node-id.json names where identity.json names another (spec 3.4.1).
// Both are this node's, read from its own app dir, and a producer that
// reads node-id.json stamps that one. A frame whose originatedFrom or
// scheduledOn names an alias is taken as this node's and relayed under
// nodeID, the id the node speaks as, so the peers' origin rule and their
// brokers see one id for the node. The frame's text is kept byte for byte
// but for those values. Without aliases, or when no alias is named, it is
// ParseIngress, at the cost of one check of the decoded frame.
func ParseIngressAs(body []byte, nodeID string, aliases []string, maxWorkload int) (Ingress, error) {
	f, err := ParseIngress(body, nodeID, maxWorkload)
	if len(aliases) == 0 || !namesAlias(f, err, aliases) {
		return f, err
	}
	speaking, ok := replaceAliases(body, nodeID, aliases)
	if !ok {
		return f, err
	}
	return ParseIngress(speaking, nodeID, maxWorkload)
}

// namesAlias reports whether ParseIngress's answer is one an alias
// changes: an origin refused for naming an alias, or a frame taken whose
// scheduledOn names one.
func namesAlias(f Ingress, err error, aliases []string) bool {
	var foreign *ForeignOriginError
	if errors.As(err, &foreign) {
		return isAlias(foreign.Origin, aliases)
	}
	return err == nil && !f.isRemoval() && isAlias(f.Life.Info.ScheduledOn, aliases)
}

func isAlias(id string, aliases []string) bool {
	for _, a := range aliases {
		if id != "" && id == a {
			return true
		}
	}
	return false
}

// replaceAliases returns body with every originatedFrom and scheduledOn of
// the frame's object (a removal's params, a lifecycle frame's
// workloadInfo) that names an alias replaced by nodeID; ok is false when
// the body does not scan or names none.
func replaceAliases(body []byte, nodeID string, aliases []string) (out []byte, ok bool) {
	var s Scan
	if s.ScanFrame(body) != nil {
		return nil, false
	}
	level := levelParams
	if s.levels[levelInfo].present {
		level = levelInfo
	}
	l := &s.levels[level]
	var at []*scanMember
	for _, name := range [...]string{"originatedFrom", "scheduledOn"} {
		m := l.exact(name)
		if m != nil && m.isString() && isAlias(string(appendUnquoted(nil, m.value)), aliases) {
			at = append(at, m)
		}
	}
	if len(at) == 0 {
		return nil, false
	}
	sort.Slice(at, func(i, j int) bool { return at[i].off < at[j].off })
	quoted := appendJSONString(nil, nodeID)
	out = make([]byte, 0, len(body)+len(at)*len(quoted))
	prev := 0
	for _, m := range at {
		out = append(append(out, body[prev:m.off]...), quoted...)
		prev = m.off + len(m.value)
	}
	return append(out, body[prev:]...), true
}
