//go:build linux

package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"nvpair-workload-manager/internal/dev/devpki"
	"nvpair-workload-manager/internal/dev/testframe"
	"nvpair-workload-manager/internal/dev/testkit"
	"nvpair-workload-manager/internal/wireframe"
)

// This file proves with a real browser (Debian's headless Chromium) that the
// loopback ingress refuses what a web page can send it. The daemon under test
// is the real binary, built once by the test, started with --local-ingress and
// a pinned peer (a second daemon); the test plays the daemon's broker
// on its stdin/stdout and reads its slog text log on stderr.
//
// The attack pages come from the test's own HTTP server, the "attacker":
//   - a second loopback origin, http://127.0.0.1:<A> (A is not the ingress
//     port, so every request to the ingress is cross-origin);
//   - the rebinding name rebind.test, which Chromium resolves to 127.0.0.2
//     (--host-resolver-rules). The attacker listens on 127.0.0.2:<A>, and a
//     "rebinding front" listens on 127.0.0.2:<P>, P being the ingress port.
//
// DNS rebinding: the attacker's name first resolves to the attacker's server,
// which hands out the page at http://rebind.test:<P>/; then the name is
// re-pointed at 127.0.0.1, and the page's same-origin requests, still
// addressed to rebind.test:<P>, reach the ingress. Chromium's resolver rules
// are static, so the front plays both roles on one address: a connection
// whose request is for the ingress's path is what the browser sends once the
// name points at the ingress, and is spliced byte for byte to 127.0.0.1:<P>;
// any other (the page load "GET /rebind/...", a favicon) is the attacker's.
// The ingress receives exactly the bytes a rebound browser sends (same port,
// Host: rebind.test:<P>, the page's Origin).
//
// The attempts run in one Chromium process, one after another, as a chain of
// top-level pages: each page makes its attempt, reports what it saw to the
// attacker's /report, and navigates to the next. /report does not answer
// before the daemon has logged as many new rejections as the attempt must
// cause, so the rejections logged between two reports belong to one attempt.
// Each attack URL carries ?attempt=<name> (the ingress checks the path, not
// the query), so Chromium's own network log (--log-net-log) attributes every
// request the browser sent to its attempt, with its method, its headers and
// the status the browser read back.
//
// Chromium retries a request answered 421 (Misdirected Request) once, on a
// fresh connection (its answer to HTTP/2 connection coalescing, applied to
// HTTP/1.1 too), so each request answered 421 reaches the ingress twice and
// is refused twice.
//
// The ingress's check order is Origin (403) -> Host (421) -> Fetch Metadata
// (403) -> path (404) -> method (405) -> Content-Type (415). A browser sends
// Origin on every request that is not a GET or HEAD (fetch in any mode,
// preflights, form POSTs, beacons, same-origin POSTs included), so every
// POST attempt is 403, and no browser request reaches the Content-Type
// check: 415 is unreachable from a page. A GET carries no Origin; under the
// rebinding name it is 421, and otherwise its Sec-Fetch-Site (the attacker's
// page, another port of 127.0.0.1, is same-site) makes it 403. The
// read-back's header cannot come from a page: a no-cors fetch drops it, a
// cors fetch sends a preflight first, which carries Origin.

// browserAttempt is one way a page can try to push a frame into the ingress.
type browserAttempt struct {
	name string
	// page is where the attack page is loaded from ({A} the attacker port,
	// {P} the ingress port); empty for the direct page load, which is the
	// chain's last navigation.
	page string
	// target is the URL prefix the page sends to; the path and
	// ?attempt=<name> are appended.
	target string
	// path is the ingress path the page sends to; empty: the events path.
	path string
	// script is the body of the page's async attempt(): T is the target
	// URL, B the frame, FORM_NAME and FORM_VALUE the frame split for a
	// text/plain form. It returns what the page saw.
	script string
	want   []int          // the statuses the daemon must log, in order
	saw    *regexp.Regexp // what the page must report
	// methods, when set, are the methods the browser must have sent.
	methods []string
	// origin, when set, is the Origin the browser must have sent.
	origin string
	// echoesForm: the page first submits its form to the attacker's /echo,
	// so the test can compare the body the browser built with the frame.
	echoesForm bool
	models     string // what the attempt models (for the log of the run)
	// reason, when set, is what every refusal's logged reason must hold.
	reason string
}

const (
	attackerOrigin = "http://127.0.0.1:{A}"
	rebindAttacker = "http://rebind.test:{A}"
	rebindOrigin   = "http://rebind.test:{P}" // the page origin after rebinding
	ingressOrigin  = "http://127.0.0.1:{P}"
	rebindHost     = "rebind.test"
	rebindAddr     = "127.0.0.2" // where Chromium resolves rebind.test
)

// noCORSRefused is what a page sees of a refused no-cors fetch: an opaque
// answer it cannot read, or an error when the browser's Opaque Response
// Blocking drops it.
var noCORSRefused = regexp.MustCompile(`^(opaque status 0: $|threw TypeError)`)

var browserAttempts = []browserAttempt{
	{
		name: "fetch-text-plain", page: attackerOrigin + "/attack/", target: ingressOrigin,
		models: "CSRF with a simple request: no preflight, the POST itself is sent",
		script: `const r = await fetch(T, {method: "POST", headers: {"Content-Type": "text/plain"}, body: B});
			return "status " + r.status;`,
		want: []int{403}, saw: regexp.MustCompile(`^threw TypeError`), methods: []string{"POST"},
	},
	{
		name: "fetch-json-preflighted", page: attackerOrigin + "/attack/", target: ingressOrigin,
		models: "application/json is not CORS-safelisted: the OPTIONS preflight reaches the daemon, the POST never follows",
		script: `const r = await fetch(T, {method: "POST", headers: {"Content-Type": "application/json"}, body: B});
			return "status " + r.status;`,
		want: []int{403}, saw: regexp.MustCompile(`^threw TypeError`), methods: []string{"OPTIONS"},
	},
	{
		name: "fetch-no-cors", page: attackerOrigin + "/attack/", target: ingressOrigin,
		models: "a blind no-cors POST: the browser drops the JSON content type and sends text/plain",
		script: `const r = await fetch(T, {method: "POST", mode: "no-cors", headers: {"Content-Type": "application/json"}, body: B});
			return r.type + " status " + r.status;`,
		want: []int{403}, saw: regexp.MustCompile(`^opaque status 0$`), methods: []string{"POST"},
	},
	{
		name: "form-text-plain", page: attackerOrigin + "/attack/", target: ingressOrigin,
		models: `an HTML form, enctype="text/plain", whose one field is "<JSON up to a string>" = "<rest>": the body is the frame`,
		script: `const sink = document.createElement("iframe");
			sink.name = "sink";
			document.body.appendChild(sink);
			const form = document.createElement("form");
			form.method = "POST"; form.enctype = "text/plain"; form.action = T; form.target = "sink";
			const field = document.createElement("input");
			field.type = "hidden"; field.name = FORM_NAME; field.value = FORM_VALUE;
			form.appendChild(field);
			document.body.appendChild(form);
			const submit = () => new Promise(loaded => { sink.onload = loaded; form.submit(); });
			// First to the attacker's /echo, which records the body the
			// browser builds from the field, then to the ingress.
			form.action = ECHO;
			await submit();
			form.action = T;
			await submit();
			return "form submitted, sink frame loaded";`,
		want: []int{403}, saw: regexp.MustCompile(`^form submitted`), methods: []string{"POST"}, echoesForm: true,
	},
	{
		name: "sandboxed-iframe-fetch", page: attackerOrigin + "/attack/", target: ingressOrigin,
		models: `a sandboxed iframe (opaque origin) posting: the browser sends "Origin: null"`,
		script: `const frame = document.createElement("iframe");
			frame.sandbox = "allow-scripts";
			frame.srcdoc = "<script>fetch(" + JSON.stringify(T) + ", {method: 'POST', headers: {'Content-Type': 'text/plain'}, body: " + JSON.stringify(B) + "})" +
				".then(r => parent.postMessage('status ' + r.status, '*'), e => parent.postMessage('threw ' + e.name + ': ' + e.message, '*'));<\/script>";
			const saw = new Promise(got => addEventListener("message", e => got(e.data)));
			document.body.appendChild(frame);
			return await saw;`,
		want: []int{403}, saw: regexp.MustCompile(`^threw TypeError`), methods: []string{"POST"}, origin: "null",
	},
	{
		name: "beacon-json-blob", page: attackerOrigin + "/attack/", target: ingressOrigin,
		models: "navigator.sendBeacon with a Blob typed application/json (Chrome once sent it with no preflight)",
		script: `return "sendBeacon returned " + navigator.sendBeacon(T, new Blob([B], {type: "application/json"}));`,
		// The method is not pinned: Chromium 148 sends an OPTIONS
		// preflight, an older one sent the POST itself; either is 403.
		want: []int{403}, saw: regexp.MustCompile(`^sendBeacon returned true$`),
	},
	{
		name: "rebind-cross-port-fetch", page: rebindAttacker + "/attack/", target: "http://rebind.test:{P}",
		models: "a page on the rebinding name, another port, posting to the ingress port under that name",
		script: `const r = await fetch(T, {method: "POST", headers: {"Content-Type": "text/plain"}, body: B});
			return "status " + r.status;`,
		want: []int{403}, saw: regexp.MustCompile(`^threw TypeError`), methods: []string{"POST"},
	},
	{
		name: "rebind-same-origin-fetch-json", page: rebindOrigin + "/rebind/", target: "",
		models: "DNS rebinding: a same-origin POST with application/json, no preflight, status readable by the page",
		script: `const r = await fetch(T, {method: "POST", headers: {"Content-Type": "application/json"}, body: B});
			return "status " + r.status;`,
		want: []int{403}, saw: regexp.MustCompile(`^status 403$`), methods: []string{"POST"},
	},
	{
		name: "rebind-same-origin-get", page: rebindOrigin + "/rebind/", target: "",
		models: "DNS rebinding: a same-origin GET carries no Origin, so the Host check answers",
		script: `const r = await fetch(T);
			return "status " + r.status;`,
		want: []int{421, 421}, saw: regexp.MustCompile(`^status 421$`), methods: []string{"GET", "GET"},
	},
	{
		name: "fetch-readback-cors", page: attackerOrigin + "/attack/", target: ingressOrigin, path: "/v1/workloads",
		models: "a page reading this node's workloads with a cross-origin GET: cors mode sends Origin",
		script: `const r = await fetch(T);
			return "status " + r.status + ": " + await r.text();`,
		want: []int{403}, saw: regexp.MustCompile(`^threw TypeError`), methods: []string{"GET"},
	},
	{
		name: "fetch-readback-no-cors", page: attackerOrigin + "/attack/", target: ingressOrigin, path: "/v1/workloads",
		models: "a blind no-cors GET of the read-back: no Origin, but its Fetch Metadata marks it a page's, so it is refused before any work",
		script: `const r = await fetch(T, {mode: "no-cors"});
			return r.type + " status " + r.status + ": " + await r.text();`,
		want: []int{403}, saw: noCORSRefused, methods: []string{"GET"}, reason: "(Sec-Fetch-Site: same-site)",
	},
	{
		name: "fetch-readback-no-cors-header", page: attackerOrigin + "/attack/", target: ingressOrigin, path: "/v1/workloads",
		models: "a no-cors GET that sets the read-back's header: a no-cors request may carry only CORS-safelisted headers, so the browser drops it",
		script: `const r = await fetch(T, {mode: "no-cors", headers: {"` + "Workload-Read-Back" + `": "1"}});
			return r.type + " status " + r.status + ": " + await r.text();`,
		want: []int{403}, saw: noCORSRefused, methods: []string{"GET"}, reason: "(Sec-Fetch-Site: same-site)",
	},
	{
		name: "fetch-readback-cors-header", page: attackerOrigin + "/attack/", target: ingressOrigin, path: "/v1/workloads",
		models: "a cors GET with the read-back's header: not CORS-safelisted, so the browser asks first with an OPTIONS preflight, which carries Origin; the GET never follows",
		script: `const r = await fetch(T, {headers: {"` + "Workload-Read-Back" + `": "1"}});
			return "status " + r.status + ": " + await r.text();`,
		want: []int{403}, saw: regexp.MustCompile(`^threw TypeError`), methods: []string{"OPTIONS"},
	},
	{
		name: "rebind-same-origin-readback", page: rebindOrigin + "/rebind/", target: "", path: "/v1/workloads",
		models: "DNS rebinding: a same-origin GET of the read-back, whose answer the page could read; the Host check answers",
		script: `const r = await fetch(T);
			return "status " + r.status + ": " + (await r.text()).trim();`,
		want: []int{421, 421}, saw: regexp.MustCompile(`^status 421: host "rebind\.test:\d+" is not this loopback local ingress$`), methods: []string{"GET", "GET"},
	},
	{
		name: "fetch-node-cors", page: attackerOrigin + "/attack/", target: ingressOrigin, path: "/v1/node",
		models: "a page reading this node's id and members with a cross-origin GET: cors mode sends Origin",
		script: `const r = await fetch(T);
			return "status " + r.status + ": " + await r.text();`,
		want: []int{403}, saw: regexp.MustCompile(`^threw TypeError`), methods: []string{"GET"},
	},
	{
		name: "fetch-node-no-cors", page: attackerOrigin + "/attack/", target: ingressOrigin, path: "/v1/node",
		models: "a blind no-cors GET of the node endpoint: no Origin, but its Fetch Metadata marks it a page's",
		script: `const r = await fetch(T, {mode: "no-cors"});
			return r.type + " status " + r.status + ": " + await r.text();`,
		want: []int{403}, saw: noCORSRefused, methods: []string{"GET"}, reason: "(Sec-Fetch-Site: same-site)",
	},
	{
		name: "rebind-page-load", page: "", target: "http://rebind.test:{P}",
		models: "DNS rebinding: the top-level page load of the ingress under the rebinding name",
		want:   []int{421, 421}, methods: []string{"GET", "GET"},
	},
}

// TestBrowserAttacksAreRefused runs every browser attempt against the real
// daemon and checks, per attempt, that it reached the ingress, that the
// ingress refused it with the expected status, and that nothing reached the
// daemon's broker side or the pinned peer (a second daemon).
func TestBrowserAttacksAreRefused(t *testing.T) {
	chromium := findChromium(t)
	d, peer := startDaemonProcess(t)
	ingressPort := ingressPortOf(t, d)

	// A workload of this node's for each read-back attempt to try to read:
	// its requesterId is the attempt's name, which the attempt filters on.
	var secrets []string
	for _, a := range browserAttempts {
		if a.path == "/v1/workloads" {
			id := readBackSecret + "-" + a.name
			secrets = append(secrets, id)
			postLegitimateFrame(t, ingressPort, strings.Replace(attackFrame(id), `"engine"`, `"requesterId":"`+a.name+`","engine"`, 1))
		}
	}
	for _, id := range secrets {
		d.WaitUpserts(id, 1)
		testkit.Eventually(t, "the peer's upsert of "+id, func() bool { return slices.Contains(upsertIDs(peer.Upserts()), id) })
	}

	atk := newAttackServer(t, d, ingressPort)
	front := startRebindFront(t, net.JoinHostPort(rebindAddr, ingressPort), net.JoinHostPort("127.0.0.1", ingressPort), atk)
	defer front.close()

	// The chain ends on the direct page load, which has no report: it is
	// done when that load's rejections are logged.
	last := len(browserAttempts) - 1
	chainDone := func() bool {
		return atk.reportedAll() && len(ingressRejections(d.stderr)) >= atk.boundary(last-1)+len(browserAttempts[last].want)
	}
	out, err := atk.runChromium(t, chromium, chainDone)
	if !atk.pageServed() {
		browserUnavailable(t, fmt.Sprintf("chromium loaded no page: %v\n%s", err, out.stderrTail()))
	}
	if err != nil {
		t.Errorf("chromium: %v\n%s", err, out.stderrTail())
	}
	t.Logf("chromium ran the attempts in %s", out.elapsed.Round(time.Millisecond))

	// Prove the pipeline past the ingress is alive with two legitimate
	// frames (the attack body and the form-shaped body, posted without
	// Origin): both must reach the daemon's broker side and the peer. The
	// ingress serializes accepted frames and the peer queue is ordered, so
	// nothing an attempt could have slipped in can still be on its way.
	barriers := []struct{ id, body string }{
		{"barrier-json", attackFrame("barrier-json")},
		{"barrier-form", func() string { n, v := attackFormField("barrier-form"); return n + "=" + v + "\r\n" }()},
	}
	for _, b := range barriers {
		postLegitimateFrame(t, ingressPort, b.body)
	}
	for _, b := range barriers {
		d.WaitUpserts(b.id, 1)
		testkit.Eventually(t, "the peer's upsert of "+b.id, func() bool { return slices.Contains(upsertIDs(peer.Upserts()), b.id) })
	}
	all := ingressRejections(d.stderr)
	atk.setFinal(len(all))

	// Nothing but the barriers (and the workload posted before the browser
	// started) reached the daemon's broker side or the peer.
	for _, f := range d.All() {
		if f.Method == wireframe.MethodRemove {
			t.Errorf("the daemon's broker got a removal: %s", f.Params)
		}
	}
	legit := append(secrets, "barrier-json", "barrier-form")
	if got := upsertIDs(d.Upserts()); !slices.Equal(got, legit) {
		t.Errorf("upserts at the daemon's broker = %q, want only %q", got, legit)
	}
	if got := upsertIDs(peer.Upserts()); !slices.Equal(got, legit) {
		t.Errorf("upserts at the peer's broker = %q, want only %q", got, legit)
	}
	if n := len(peer.WithMethod(wireframe.MethodRemove)); n != 0 {
		t.Errorf("the peer's broker got %d removal(s)", n)
	}
	// The ingress logs an accepted frame after it commits it, so the broker
	// can see the last barrier before its log line is written: wait for that
	// line, then count. Frames are accepted in order, so an attempt that got
	// in would have been logged before it.
	testkit.Eventually(t, "the log line of barrier-form's acceptance", func() bool {
		for _, line := range strings.Split(d.stderr.String(), "\n") {
			if strings.Contains(line, `msg="ingress frame accepted"`) && strings.HasSuffix(line, " id=barrier-form") {
				return true
			}
		}
		return false
	})
	if n := strings.Count(d.stderr.String(), `msg="ingress frame accepted"`); n != len(legit) {
		t.Errorf("the daemon accepted %d ingress frames, want only the %d legitimate ones", n, len(legit))
	}

	netlog, nlErr := parseNetLog(out.netlog)
	if nlErr != nil {
		t.Errorf("chromium's network log: %v", nlErr)
	}
	for i, a := range browserAttempts {
		t.Run(a.name, func(t *testing.T) {
			got := all[atk.boundary(i-1):atk.boundary(i)]
			statuses := make([]int, len(got))
			for j, r := range got {
				statuses[j] = r.status
			}
			t.Logf("%s (%s): the daemon answered %v", a.name, a.models, statuses)
			if !slices.Equal(statuses, a.want) {
				t.Errorf("the daemon logged rejections %v, want %v:\n%s", statuses, a.want, rejectionLines(got))
			}
			for _, r := range got {
				if a.reason != "" && !strings.Contains(r.line, a.reason) {
					t.Errorf("the refusal does not give %q:\n%s", a.reason, r.line)
				}
				if r.status == http.StatusOK && !strings.Contains(r.line, " listed=1 ") {
					t.Errorf("the read-back answer did not hold the attempt's secret workload, so it shows nothing:\n%s", r.line)
				}
			}
			// What the page saw.
			if a.page == "" {
				// No page of the attacker's: the browser's network log
				// below has the status it read.
			} else if saw, ok := atk.report(a.name); !ok {
				t.Errorf("the page never reported")
			} else if !a.saw.MatchString(saw) || strings.Contains(saw, readBackSecret) {
				t.Errorf("the page saw %q, want %s", saw, a.saw)
			} else {
				t.Logf("the page saw: %s", saw)
			}
			if a.echoesForm {
				// The body the browser built from the field is the frame,
				// in the shape the barrier-form frame proved acceptable.
				n, v := attackFormField("browser-" + a.name)
				if got := atk.echo(a.name); got != n+"="+v+"\r\n" {
					t.Errorf("the form's body is %q, want %q", got, n+"="+v+"\r\n")
				}
			}
			// What the browser sent, by its own network log.
			if nlErr == nil {
				checkBrowserRequests(t, a, netlog[a.name], ingressPort)
			}
		})
	}
}

// checkBrowserRequests checks Chromium's own record of the requests an
// attempt sent to the ingress against what the daemon answered.
func checkBrowserRequests(t *testing.T, a browserAttempt, reqs []netlogRequest, ingressPort string) {
	t.Helper()
	var desc []string
	for _, r := range reqs {
		desc = append(desc, fmt.Sprintf("%s Host=%s Origin=%q Content-Type=%q Sec-Fetch-Site=%q Sec-Fetch-Mode=%q -> %d",
			r.method, r.header("Host"), r.header("Origin"), r.header("Content-Type"), r.header("Sec-Fetch-Site"), r.header("Sec-Fetch-Mode"), r.status))
	}
	t.Logf("the browser sent: %s", strings.Join(desc, "; "))
	if len(reqs) != len(a.want) {
		t.Fatalf("the browser sent %d request(s) to the ingress, want %d", len(reqs), len(a.want))
	}
	for j, r := range reqs {
		if r.status != a.want[j] {
			t.Errorf("request %d: the browser read status %d, want %d", j, r.status, a.want[j])
		}
		if a.origin != "" && r.header("Origin") != a.origin {
			t.Errorf("request %d: Origin %q, want %q", j, r.header("Origin"), a.origin)
		}
		if a.methods != nil && r.method != a.methods[j] {
			t.Errorf("request %d: method %s, want %s", j, r.method, a.methods[j])
		}
		_, hasOrigin := r.headerOK("Origin")
		if _, sent := r.headerOK("Workload-Read-Back"); sent && r.method != http.MethodOptions {
			t.Errorf("request %d: the page sent the read-back's header %s without a preflight", j, "Workload-Read-Back")
		}
		switch a.want[j] {
		case http.StatusOK:
			if hasOrigin || a.path != "/v1/workloads" {
				t.Errorf("request %d: answered 200 with an Origin (%v) or on the events path (%q)", j, hasOrigin, a.path)
			}
		case http.StatusForbidden:
			if site, _ := r.headerOK("Sec-Fetch-Site"); !hasOrigin && (site == "" || site == "none") {
				t.Errorf("request %d: refused with 403 but sent no Origin and no page's Sec-Fetch-Site", j)
			}
		case http.StatusMisdirectedRequest:
			if hasOrigin {
				t.Errorf("request %d: carries an Origin, so 421 is not the Host check's answer", j)
			}
			if want := net.JoinHostPort(rebindHost, ingressPort); r.header("Host") != want {
				t.Errorf("request %d: Host %q, want %q", j, r.header("Host"), want)
			}
		}
	}
}

// findChromium returns the Chromium binary, or skips (fails under CI=true).
func findChromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	browserUnavailable(t, "no chromium on PATH (Debian: apt-get install -y chromium)")
	return ""
}

// browserUnavailable skips the test, or fails it under CI=true, where the
// browser must be there (.ci/run installs it).
func browserUnavailable(t *testing.T, reason string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true and the browser test cannot run: %s", reason)
	}
	t.Skipf("browser test skipped: %s", reason)
}

// startDaemonProcess starts the real daemon binary with an ingress on
// 127.0.0.1 and a peer (a second daemon) pinned, tells it about the peer,
// and waits until the peer is a broadcast target. At cleanup it must exit
// 0 on stdin EOF.
func startDaemonProcess(t *testing.T) (d, peer *daemonProc) {
	t.Helper()
	id := devpki.NewUUID()
	ident, err := devpki.Mint(id)
	if err != nil {
		t.Fatal(err)
	}
	peerNode := writeCluster(t, 1)[0]
	app := t.TempDir()
	cluster := filepath.Join(app, "cluster")
	if err := devpki.WriteIdentity(cluster, ident); err != nil {
		t.Fatal(err)
	}
	if err := devpki.PinIdentity(cluster, peerNode.Identity); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(app, "node-id"), id+"\n")
	// The peer pins the daemon, so it accepts its broadcasts. It is told of
	// no member, so it sends the daemon nothing.
	if err := devpki.PinIdentity(peerNode.ClusterDir, ident); err != nil {
		t.Fatal(err)
	}
	peer = startNode(t, peerNode)

	// No heartbeat pass within the test: a browser slow to start on a busy
	// machine would otherwise see the workloads re-asserted to the peer,
	// whose broker then holds them twice.
	d = startDaemon(t, "--app-dir", app, "--port", "0", "--local-ingress", "127.0.0.1:0", "--log-level", "debug", "--resync-interval", "1h")
	t.Cleanup(func() {
		d.closeStdin()
		d.wantCleanExit(d.waitExit(testkit.WaitTimeout))
	})
	d.WaitMethod("ready", 1)
	d.discover(peerNode, peer.port)
	d.waitLog(`msg="broadcast targets changed"`, "total=1")
	return d, peer
}

var ingressListening = regexp.MustCompile(`msg="local ingress listening" .*addr=127\.0\.0\.1:(\d+)`)

// ingressPortOf returns the port the daemon's ingress bound.
func ingressPortOf(t *testing.T, d *daemonProc) string {
	t.Helper()
	var port string
	testkit.Eventually(t, "the ingress listening", func() bool {
		m := ingressListening.FindStringSubmatch(d.stderr.String())
		if m != nil {
			port = m[1]
		}
		return m != nil
	})
	return port
}

// ingressRejection is one "ingress request rejected" line of the daemon,
// or one "ingress read-back answered" line: an attempt on the read-back
// that passes the checks is answered, and its answer is what it caused.
type ingressRejection struct {
	status int
	line   string
}

var rejectionStatus = regexp.MustCompile(` status=(\d+) `)

func ingressRejections(logs *testkit.LogBuffer) []ingressRejection {
	var out []ingressRejection
	lines := strings.Split(logs.String(), "\n")
	for _, line := range lines[:len(lines)-1] { // the last is not complete yet

		if !strings.Contains(line, `msg="ingress request rejected"`) && !strings.Contains(line, `msg="ingress read-back answered"`) {
			continue
		}
		r := ingressRejection{line: line}
		if m := rejectionStatus.FindStringSubmatch(line); m != nil {
			r.status, _ = strconv.Atoi(m[1])
		}
		out = append(out, r)
	}
	return out
}

func rejectionLines(rs []ingressRejection) string {
	var b strings.Builder
	for _, r := range rs {
		b.WriteString(r.line + "\n")
	}
	return b.String()
}

// readBackSecret starts the ids of the workloads the read-back attempts
// try to read: no page may ever see one.
const readBackSecret = "readback-secret"

// attackFrame is the frame every attempt tries to deliver: a valid
// workload:started that the ingress would accept (the barrier proves it) and
// stamp with the node's id.
func attackFrame(id string) string {
	return string(testframe.Lifecycle(testframe.Workload(id, "running", "", map[string]any{"originatedFrom": nil}), nil))
}

// attackFormField splits a frame for a text/plain form: the browser sends
// name + "=" + value + CRLF, which is the frame with an extra "pad" member
// whose value is "=" (the trailing CRLF is JSON whitespace).
func attackFormField(id string) (name, value string) {
	frame := attackFrame(id)
	padded := frame[:len(frame)-1] + `,"pad":"="}`
	i := strings.LastIndex(padded, "=")
	return padded[:i], padded[i+1:]
}

// postLegitimateFrame posts a frame the way a producer does (no Origin, a
// loopback Host, application/json) and requires 200.
func postLegitimateFrame(t *testing.T, port, body string) {
	t.Helper()
	resp, err := http.Post("http://127.0.0.1:"+port+wireframe.EventsPath, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	answer, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("legitimate frame: status %d (%s), want 200; body %s", resp.StatusCode, answer, body)
	}
}

// attackServer is the attacker's web server: the attack pages, the chain
// between them and the /report endpoint.
type attackServer struct {
	t           *testing.T
	d           *daemonProc
	ingressPort string
	port        string // A
	srv         *http.Server

	mu         sync.Mutex // guards the fields below
	served     bool
	next       int      // index of the attempt whose report is due
	boundaries []int    // rejection count when attempt i's report was answered
	base       int      // rejection count before the browser started
	final      int      // rejection count after the barriers
	reports    []string // what each page saw
	reported   []bool
	echoed     map[string]string // attempt -> the body posted to /echo
}

// newAttackServer listens on 127.0.0.1:<A> and on rebindAddr:<A>, the
// second being where rebind.test:<A> resolves.
func newAttackServer(t *testing.T, d *daemonProc, ingressPort string) *attackServer {
	t.Helper()
	a := &attackServer{t: t, d: d, ingressPort: ingressPort,
		boundaries: make([]int, len(browserAttempts)), reports: make([]string, len(browserAttempts)),
		reported: make([]bool, len(browserAttempts)), echoed: map[string]string{}}
	a.srv = &http.Server{Handler: a, ReadHeaderTimeout: testkit.WaitTimeout}
	var lns []net.Listener
	for try := 0; try < 10 && lns == nil; try++ {
		ln1, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		_, port, _ := net.SplitHostPort(ln1.Addr().String())
		ln2, err := net.Listen("tcp", net.JoinHostPort(rebindAddr, port))
		if err != nil {
			ln1.Close()
			continue
		}
		a.port, lns = port, []net.Listener{ln1, ln2}
	}
	if lns == nil {
		t.Fatalf("cannot listen on %s and 127.0.0.1 with one port", rebindAddr)
	}
	for _, ln := range lns {
		go func() { _ = a.srv.Serve(ln) }()
	}
	t.Cleanup(func() { a.srv.Close() })
	return a
}

func (a *attackServer) expand(s string) string {
	return strings.NewReplacer("{A}", a.port, "{P}", a.ingressPort).Replace(s)
}

// pageURL is where the chain loads attempt i; past the last page attempt it
// is the direct page load of the ingress under the rebinding name.
func (a *attackServer) pageURL(i int) string {
	at := browserAttempts[i]
	if at.page == "" {
		return a.targetURL(i)
	}
	return a.expand(at.page) + at.name
}

func (a *attackServer) targetURL(i int) string {
	at := browserAttempts[i]
	if at.path == "/v1/workloads" {
		// The read-back refuses parameters it does not know: the
		// attempt's name is the requesterId its secret workload carries.
		return a.expand(at.target) + "/v1/workloads" + "?requesterId=" + at.name
	}
	if at.path == "/v1/node" {
		// The node endpoint takes no query (400), but only after the
		// browser checks, which answer every attempt first.
		return a.expand(at.target) + "/v1/node" + "?attempt=" + at.name
	}
	return a.expand(at.target) + wireframe.EventsPath + "?attempt=" + at.name
}

func (a *attackServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case strings.HasPrefix(r.URL.Path, "/attack/"), strings.HasPrefix(r.URL.Path, "/rebind/"):
		a.servePage(w, r)
	case r.URL.Path == "/report":
		a.serveReport(w, r)
	case r.URL.Path == "/echo":
		body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		a.mu.Lock()
		a.echoed[r.URL.Query().Get("attempt")] = string(body)
		a.mu.Unlock()
		fmt.Fprintln(w, "echoed")
	default:
		http.NotFound(w, r)
	}
}

func (a *attackServer) attemptIndex(name string) int {
	for i, at := range browserAttempts {
		if at.name == name {
			return i
		}
	}
	return -1
}

const attackPage = `<!doctype html>
<html><head><meta charset="utf-8"><link rel="icon" href="data:,"><title>%[1]s</title></head>
<body><p id="saw">running</p><script>
const T = %[2]s, B = %[3]s, FORM_NAME = %[4]s, FORM_VALUE = %[5]s;
const NAME = %[1]s, REPORT = %[6]s, NEXT = %[7]s, ECHO = %[9]s;
async function attempt() {
	%[8]s
}
(async () => {
	let saw;
	try { saw = await attempt(); } catch (e) { saw = "threw " + e.name + ": " + e.message; }
	document.getElementById("saw").textContent = saw;
	try {
		await fetch(REPORT + "?attempt=" + encodeURIComponent(NAME) + "&saw=" + encodeURIComponent(saw), {mode: "no-cors", cache: "no-store"});
	} catch (e) {}
	location.href = NEXT;
})();
</script></body></html>
`

func (a *attackServer) servePage(w http.ResponseWriter, r *http.Request) {
	i := a.attemptIndex(strings.TrimPrefix(strings.TrimPrefix(r.URL.Path, "/attack/"), "/rebind/"))
	if i < 0 || i == len(browserAttempts)-1 {
		http.NotFound(w, r)
		return
	}
	at := browserAttempts[i]
	a.mu.Lock()
	a.served = true
	a.mu.Unlock()
	target := a.targetURL(i)
	id := "browser-" + at.name
	formName, formValue := attackFormField(id)
	js := func(s string) string { // a JS string literal; json escapes <, > and &
		b, _ := json.Marshal(s)
		return string(b)
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	fmt.Fprintf(w, attackPage, js(at.name), js(target), js(attackFrame(id)), js(formName), js(formValue),
		js("http://127.0.0.1:"+a.port+"/report"), js(a.pageURL(i+1)), at.script,
		js("http://127.0.0.1:"+a.port+"/echo?attempt="+at.name))
}

// serveReport records what a page saw, and answers only once the daemon has
// logged the attempt's rejections, so the next attempt starts after them.
func (a *attackServer) serveReport(w http.ResponseWriter, r *http.Request) {
	name, saw := r.URL.Query().Get("attempt"), r.URL.Query().Get("saw")
	i := a.attemptIndex(name)
	a.mu.Lock()
	expected := a.next
	a.mu.Unlock()
	if i != expected {
		a.t.Errorf("report from attempt %q out of order (expected attempt %d)", name, expected)
		http.Error(w, "out of order", http.StatusBadRequest)
		return
	}
	start := a.boundary(i - 1)
	need := start + len(browserAttempts[i].want)
	deadline := time.Now().Add(testkit.WaitTimeout)
	count := len(ingressRejections(a.d.stderr))
	for count < need && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
		count = len(ingressRejections(a.d.stderr))
	}
	a.mu.Lock()
	a.reports[i], a.reported[i] = saw, true
	a.boundaries[i] = count
	a.next = i + 1
	a.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// reportedAll reports whether every page that reports has done so.
func (a *attackServer) reportedAll() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.next == len(browserAttempts)-1
}

func (a *attackServer) echo(name string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.echoed[name]
}

func (a *attackServer) pageServed() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.served
}

// boundary returns the number of rejections logged when attempt i was done:
// before the browser started for i = -1, after the barriers for the last.
func (a *attackServer) boundary(i int) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case i < 0:
		return a.base
	case i == len(browserAttempts)-1:
		return a.final
	}
	// An attempt whose report never came (the chain stopped) is
	// attributed nothing, so its own check reports the missing rejections.
	for ; i >= 0; i-- {
		if a.reported[i] {
			return a.boundaries[i]
		}
	}
	return a.base
}

func (a *attackServer) setFinal(n int) {
	a.mu.Lock()
	a.final = n
	a.mu.Unlock()
}

func (a *attackServer) report(name string) (string, bool) {
	i := a.attemptIndex(name)
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.reports[i], a.reported[i]
}

// browserRunTimeout bounds the whole chain of attempts in one Chromium.
const browserRunTimeout = 40 * time.Second

// chromiumRun is what one Chromium run left behind.
type chromiumRun struct {
	stderr  string
	netlog  string // path of Chromium's network log
	elapsed time.Duration
}

func (c chromiumRun) stderrTail() string {
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(c.stderr), "\n") {
		if !strings.Contains(l, "dbus") { // no bus here, and Chromium says so at length
			lines = append(lines, l)
		}
	}
	if len(lines) > 20 {
		lines = lines[len(lines)-20:]
	}
	return strings.Join(lines, "\n")
}

// runChromium loads the first attack page in headless Chromium, waits until
// done reports that the chain has ended (or Chromium exits, or a deadline),
// then stops Chromium with SIGTERM, which it answers with a clean shutdown
// that completes the network log.
func (a *attackServer) runChromium(t *testing.T, chromium string, done func() bool) (chromiumRun, error) {
	t.Helper()
	a.mu.Lock()
	a.base = len(ingressRejections(a.d.stderr))
	a.mu.Unlock()
	return runChromiumAt(t, chromium, a.pageURL(0), done)
}

// runChromiumAt loads page in headless Chromium, waits until done reports
// that what the page does has ended (or Chromium exits, or a deadline),
// then stops Chromium as runChromium does.
func runChromiumAt(t *testing.T, chromium, page string, done func() bool) (chromiumRun, error) {
	t.Helper()
	dir := t.TempDir()
	run := chromiumRun{netlog: filepath.Join(dir, "netlog.json")}
	cmd := exec.Command(chromium,
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir="+filepath.Join(dir, "profile"),
		// rebind.test is the attacker's name; every other name but the
		// 127.0.0.1 literal fails, so the browser talks to nothing but
		// the test (MAP * applies to address literals too).
		"--host-resolver-rules=MAP "+rebindHost+" "+rebindAddr+", MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
		"--log-net-log="+run.netlog,
		page)
	// Chromium starts helper processes: run it in its own process group,
	// and end what is left of the group once it has exited.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = io.Discard, &stderr
	began := time.Now()
	if err := cmd.Start(); err != nil {
		return run, err
	}
	pgid := cmd.Process.Pid
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { _ = syscall.Kill(-pgid, syscall.SIGKILL) })

	var err error
	running := true
	deadline := time.Now().Add(browserRunTimeout)
	for running && err == nil && !done() {
		select {
		case werr := <-exited:
			running = false
			err = fmt.Errorf("chromium exited before the attempts were done: %v", werr)
		case <-time.After(10 * time.Millisecond):
			if time.Now().After(deadline) {
				err = fmt.Errorf("the attempts were not done after %s", browserRunTimeout)
			}
		}
	}
	run.elapsed = time.Since(began)
	if running {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(testkit.WaitTimeout):
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			<-exited
		}
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	run.stderr = stderr.String()
	return run, err
}

// rebindFront listens where the rebinding name resolves, on the ingress's
// port. A connection whose request is for the ingress's path is what the
// browser sends once the name points at the ingress, and is spliced to it
// unchanged; any other (the page load, a favicon) is the attacker's.
type rebindFront struct {
	ln      net.Listener
	ingress string
	page    http.Handler
	wg      sync.WaitGroup
}

func startRebindFront(t *testing.T, addr, ingress string, page http.Handler) *rebindFront {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("rebinding front: %v", err)
	}
	f := &rebindFront{ln: ln, ingress: ingress, page: page}
	f.wg.Go(f.serve)
	return f
}

func (f *rebindFront) close() {
	f.ln.Close()
	f.wg.Wait()
}

func (f *rebindFront) serve() {
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		f.wg.Go(func() { f.handle(c) })
	}
}

func (f *rebindFront) handle(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(testkit.WaitTimeout))
	br := bufio.NewReader(c)
	line, err := peekLine(br)
	if err != nil {
		return
	}
	// The events path and the read-back's both start with "/v1/workloads".
	if _, target, _ := strings.Cut(line, " "); !strings.HasPrefix(target, "/v1/workloads") {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		rec := httptest.NewRecorder()
		f.page.ServeHTTP(rec, req)
		resp := rec.Result()
		resp.ContentLength = int64(rec.Body.Len())
		resp.Close = true // one request per connection, routed by its line
		_ = resp.Write(c)
		return
	}
	up, err := net.Dial("tcp", f.ingress)
	if err != nil {
		return
	}
	defer up.Close()
	_ = up.SetDeadline(time.Now().Add(testkit.WaitTimeout))
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(up, br)
		_ = up.(*net.TCPConn).CloseWrite()
	}()
	_, _ = io.Copy(c, up)
	c.Close()
	<-done
}

// peekLine returns the first line the client sent without consuming it.
func peekLine(br *bufio.Reader) (string, error) {
	for n := 1; n <= 4096; n++ {
		b, err := br.Peek(n)
		if err != nil {
			return "", err
		}
		if b[n-1] == '\n' {
			return string(b), nil
		}
	}
	return "", errors.New("request line too long")
}

// netlogRequest is one request the browser sent to the ingress's path, by
// Chromium's network log.
type netlogRequest struct {
	method  string
	line    string
	headers []string
	status  int // the status the browser read; 0 if none
}

func (r netlogRequest) headerOK(name string) (string, bool) {
	for _, h := range r.headers {
		k, v, ok := strings.Cut(h, ":")
		if ok && strings.EqualFold(strings.TrimSpace(k), name) {
			return strings.TrimSpace(v), true
		}
	}
	return "", false
}

func (r netlogRequest) header(name string) string {
	v, _ := r.headerOK(name)
	return v
}

// parseNetLog reads Chromium's --log-net-log file and returns, per attempt
// (the ?attempt= of the request line), the requests sent to the ingress's
// path with the status read back.
func parseNetLog(path string) (map[string][]netlogRequest, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var log struct {
		Constants struct {
			LogEventTypes map[string]int `json:"logEventTypes"`
		} `json:"constants"`
		Events []struct {
			Type   int `json:"type"`
			Source struct {
				ID int `json:"id"`
			} `json:"source"`
			Params json.RawMessage `json:"params"`
		} `json:"events"`
	}
	if err := json.Unmarshal(b, &log); err != nil {
		// Chromium ended by a signal leaves the log open: one event per
		// line after the constants, each ending in "},". Close it after
		// the last whole event.
		i := bytes.LastIndex(b, []byte("},\n"))
		if i < 0 {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		fixed := append(b[:i+1:i+1], "]}"...)
		if err2 := json.Unmarshal(fixed, &log); err2 != nil {
			return nil, fmt.Errorf("%s: %w (and closed after the last event: %v)", path, err, err2)
		}
	}
	send, ok1 := log.Constants.LogEventTypes["HTTP_TRANSACTION_SEND_REQUEST_HEADERS"]
	read, ok2 := log.Constants.LogEventTypes["HTTP_TRANSACTION_READ_RESPONSE_HEADERS"]
	if !ok1 || !ok2 {
		return nil, errors.New("the network log names no HTTP transaction events")
	}
	type ref struct {
		attempt string
		i       int
	}
	out := map[string][]netlogRequest{}
	pending := map[int]ref{} // source id -> its request awaiting a response
	for _, e := range log.Events {
		switch e.Type {
		case send:
			var p struct {
				Line    string   `json:"line"`
				Headers []string `json:"headers"`
			}
			if json.Unmarshal(e.Params, &p) != nil {
				continue
			}
			method, rest, _ := strings.Cut(p.Line, " ")
			target, _, _ := strings.Cut(rest, " ")
			u, err := url.Parse(target)
			if err != nil || (u.Path != wireframe.EventsPath && u.Path != "/v1/workloads" && u.Path != "/v1/node") {
				continue
			}
			name := u.Query().Get("attempt")
			if u.Path == "/v1/workloads" {
				name = u.Query().Get("requesterId")
			}
			out[name] = append(out[name], netlogRequest{method: method, line: strings.TrimSpace(p.Line), headers: p.Headers})
			pending[e.Source.ID] = ref{name, len(out[name]) - 1}
		case read:
			r, ok := pending[e.Source.ID]
			if !ok {
				continue
			}
			delete(pending, e.Source.ID)
			var p struct {
				Headers []string `json:"headers"`
			}
			if json.Unmarshal(e.Params, &p) != nil || len(p.Headers) == 0 {
				continue
			}
			if f := strings.Fields(p.Headers[0]); len(f) >= 2 {
				out[r.attempt][r.i].status, _ = strconv.Atoi(f[1])
			}
		}
	}
	return out, nil
}

func upsertIDs(ws []map[string]any) []string {
	var ids []string
	for _, w := range ws {
		id, _ := w["id"].(string)
		ids = append(ids, id)
	}
	return ids
}

// readBackLoopPage is a page that loops blind read-backs of the ingress,
// as an attacker's page would to make the daemon work, or to time the
// answers: LOOPS loops at once, each EACH fetches or until SECONDS have
// passed, in turn a plain no-cors GET of a requester with jobs, one that
// also sets the read-back's header (which a no-cors fetch drops) and one
// of a requester without jobs. It then reports how many it sent.
const readBackLoopPage = `<!doctype html>
<html><head><meta charset="utf-8"><link rel="icon" href="data:,"><title>loop</title></head>
<body><p id="sent">running</p><script>
const HIT = %[1]s, MISS = %[2]s, REPORT = %[3]s, HEADER = %[4]s;
const LOOPS = 6, EACH = %[5]d, SECONDS = 5;
let sent = 0;
const until = Date.now() + SECONDS * 1000;
async function loop() {
	for (let i = 0; i < EACH && Date.now() < until; i++) {
		const opts = {mode: "no-cors", cache: "no-store"};
		if (i %% 3 == 1) opts.headers = {[HEADER]: "1"};
		try { await fetch(i %% 3 == 2 ? MISS : HIT, opts); } catch (e) {}
		sent++;
	}
}
(async () => {
	await Promise.all(Array.from({length: LOOPS}, loop));
	document.getElementById("sent").textContent = sent;
	try { await fetch(REPORT + "?sent=" + sent, {mode: "no-cors", cache: "no-store"}); } catch (e) {}
})();
</script></body></html>
`

// TestBrowserPageLoopingReadBacksMakesTheDaemonDoNoWork is the issue's
// attack on the real binary: a page in headless Chromium loops no-cors
// read-backs of a node holding 100,000 workloads while a producer posts.
// Every read-back the page sends is refused by its Fetch Metadata before
// any work, which the walk's count of entries looked at shows: it does not
// move. The producer gets 200 throughout. And the two timing cases, a
// requester with jobs and one without, look at the same entries when a
// program asks them.
func TestBrowserPageLoopingReadBacksMakesTheDaemonDoNoWork(t *testing.T) {
	chromium := findChromium(t)
	const victims, set = 100, 100_000
	nodes := writeCluster(t, 1)
	d := startNode(t, nodes[0], "--local-ingress", "127.0.0.1:0", "--metrics", "127.0.0.1:0", "--resync-interval", "1h", "--log-level", "info")
	t.Cleanup(func() {
		d.closeStdin()
		d.wantCleanExit(d.waitExit(testkit.WaitTimeout))
	})
	id := d.readyNodeID()
	ingress := d.loggedValue("local ingress listening", "addr")
	metrics := d.loggedValue("metrics endpoint listening", "addr")
	producer := &http.Client{Timeout: testkit.WaitTimeout}
	post := func(body string) (int, time.Duration) {
		began := time.Now()
		resp, err := producer.Post("http://"+ingress+wireframe.EventsPath, "application/json", strings.NewReader(body))
		if err != nil {
			t.Errorf("producer post: %v", err)
			return 0, 0
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, time.Since(began)
	}
	victimFrame := func(i, seq int) string {
		w := leasedInfo("victim-"+strconv.Itoa(i), "running", seq)
		w["requesterId"] = "victim"
		return string(testframe.Lifecycle(w, nil))
	}

	// The set: the victim's jobs through the ingress, at the head of the
	// pass order, then the broker's own workloads up to 100,000.
	for i := range victims {
		if st, _ := post(victimFrame(i, 1)); st != http.StatusOK {
			t.Fatalf("victim job %d: status %d", i, st)
		}
	}
	line := testframe.LifecycleLine("proxy-ID", "running", id)
	w := bufio.NewWriterSize(d.stdin, 1<<20)
	for i := range set - victims {
		w.WriteString(strings.Replace(line, "proxy-ID", "proxy-"+strconv.Itoa(i), 2))
		w.WriteByte('\n')
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "the set to hold 100,000 workloads", func() bool {
		return testkit.ScrapeAddr(t, metrics)["nvpair_wlm_resync_set_entries"] == set
	})

	// A program's read-backs: the requester with jobs and one without look
	// at the same entries, the whole set.
	scanned := func() float64 { return testkit.ScrapeAddr(t, metrics)["nvpair_wlm_readback_entries_scanned_total"] }
	for _, q := range []struct {
		query  string
		listed int
	}{{"requesterId=victim&limit=1", 1}, {"requesterId=nobody&limit=1", 0}} {
		before := scanned()
		began := time.Now()
		a := testkit.ReadBack(t, ingress, q.query)
		took := time.Since(began)
		if got := scanned() - before; got != set || len(a.Workloads) != q.listed {
			t.Errorf("%s looked at %.0f entries and listed %d, want all %d and %d", q.query, got, len(a.Workloads), set, q.listed)
		}
		t.Logf("a program's %s: %d listed, answered in %s", q.query, len(a.Workloads), took.Round(time.Microsecond))
	}

	// The producer posts a frame every 5 ms until stop is closed, for its
	// statuses and, for the log, its latency and the daemon's CPU: first
	// with nobody else on the ingress, then beside the page.
	seq := 2
	produce := func(stop <-chan struct{}) (statuses []int, took []time.Duration) {
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return statuses, took
			case <-tick.C:
			}
			st, d := post(victimFrame(0, seq))
			seq++
			statuses, took = append(statuses, st), append(took, d)
		}
	}
	quietStop := make(chan struct{})
	quietCPU := testkit.ScrapeAddr(t, metrics)["process_cpu_seconds_total"]
	quietBegan := time.Now()
	time.AfterFunc(2*time.Second, func() { close(quietStop) })
	quietStatuses, quiet := produce(quietStop)
	quietCPU = testkit.ScrapeAddr(t, metrics)["process_cpu_seconds_total"] - quietCPU
	quietFor := time.Since(quietBegan)

	// The page, served from another port of 127.0.0.1.
	reported := make(chan int, 1)
	page := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/loop":
			js := func(s string) string { b, _ := json.Marshal(s); return string(b) }
			target := "http://" + ingress + "/v1/workloads" + "?limit=1&requesterId="
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			fmt.Fprintf(w, readBackLoopPage, js(target+"victim"), js(target+"nobody"), js("http://"+r.Host+"/report"), js("Workload-Read-Back"), 100)
		case "/report":
			n, _ := strconv.Atoi(r.URL.Query().Get("sent"))
			select {
			case reported <- n:
			default:
			}
			w.WriteHeader(http.StatusNoContent)
		default:
			http.NotFound(w, r)
		}
	}))
	defer page.Close()

	before := testkit.ScrapeAddr(t, metrics)
	rejectedBefore := strings.Count(d.stderr.String(), `msg="ingress request rejected"`)
	var statuses []int
	var loaded []time.Duration
	producing := make(chan struct{})
	stop := make(chan struct{})
	go func() {
		defer close(producing)
		statuses, loaded = produce(stop)
	}()
	sent := -1
	out, err := runChromiumAt(t, chromium, page.URL+"/loop", func() bool {
		select {
		case n := <-reported:
			sent = n
		default:
		}
		return sent >= 0
	})
	close(stop)
	<-producing
	if sent < 0 {
		browserUnavailable(t, fmt.Sprintf("the page never reported: %v\n%s", err, out.stderrTail()))
	}
	after := testkit.ScrapeAddr(t, metrics)
	delta := func(series string) float64 { return after[series] - before[series] }
	t.Logf("the page sent %d read-backs while Chromium ran %s; the daemon's CPU meanwhile %.2f s (%.0f ms/s), alone %.2f s in %s (%.0f ms/s)",
		sent, out.elapsed.Round(time.Millisecond), delta("process_cpu_seconds_total"), 1000*delta("process_cpu_seconds_total")/out.elapsed.Seconds(),
		quietCPU, quietFor.Round(time.Millisecond), 1000*quietCPU/quietFor.Seconds())
	t.Logf("the producer's posts: %d, p50 %s p99 %s beside the page; %d, p50 %s p99 %s alone",
		len(loaded), percentile(loaded, 50), percentile(loaded, 99), len(quiet), percentile(quiet, 50), percentile(quiet, 99))
	statuses = append(quietStatuses, statuses...)

	if sent == 0 {
		t.Fatal("the page sent no read-back")
	}
	if got := delta("nvpair_wlm_readback_entries_scanned_total"); got != 0 {
		t.Errorf("the read-back's walks looked at %.0f entries while the page looped: its requests did work", got)
	}
	if got := delta("nvpair_wlm_ingress_fetch_metadata_refusals_total"); got != float64(sent) {
		t.Errorf("%.0f requests refused by their Fetch Metadata, want the page's %d", got, sent)
	}
	if got := delta(`nvpair_wlm_ingress_responses_total{code="403"}`); got != float64(sent) {
		t.Errorf("%.0f answers 403, want the page's %d", got, sent)
	}
	if got := delta(`nvpair_wlm_ingress_responses_total{code="200"}`); got != float64(len(statuses)-len(quietStatuses)) {
		t.Errorf("%.0f answers 200, want only the producer's %d", got, len(statuses)-len(quietStatuses))
	}
	for i, st := range statuses {
		if st != http.StatusOK {
			t.Fatalf("the producer's post %d of %d: status %d, want 200", i, len(statuses), st)
		}
	}
	if len(statuses) == 0 {
		t.Error("the producer posted nothing while the page looped")
	}
	// One warning for the page's refusals, then one per 10 s at most.
	if n := strings.Count(d.stderr.String(), `msg="ingress request rejected"`) - rejectedBefore; n < 1 || n > 1+int(out.elapsed/(10*time.Second))+1 {
		t.Errorf("%d warnings for %d refusals in %s, want one and then one per 10 s", n, sent, out.elapsed.Round(time.Millisecond))
	}

	// What the browser sent, by its own network log: every read-back
	// carries a page's Sec-Fetch-Site, none the read-back's header, and
	// each was answered 403.
	netlog, err := parseNetLog(out.netlog)
	if err != nil {
		t.Fatalf("chromium's network log: %v", err)
	}
	reqs := append(netlog["victim"], netlog["nobody"]...)
	if len(reqs) != sent {
		t.Errorf("the network log holds %d read-backs, the page reported %d", len(reqs), sent)
	}
	for _, r := range reqs {
		site, _ := r.headerOK("Sec-Fetch-Site")
		if _, hdr := r.headerOK("Workload-Read-Back"); r.status != http.StatusForbidden || site != "same-site" || hdr {
			t.Fatalf("the browser sent %s with Sec-Fetch-Site %q (the read-back's header: %v) and read %d; want same-site, no header, 403", r.line, site, hdr, r.status)
		}
	}
}

// percentile returns the p-th percentile of ds (0 for none).
func percentile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)].Round(time.Microsecond)
}
