"""wlmclient against a server that is slow, wrong or hostile (issue 33).

Each case says what the client must do and bounds the time and the memory
it may take doing it. Run: python3 -m unittest discover clients/python
"""

import json
import logging
import socket
import threading
import time
import tracemalloc
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import wlmclient

SELF = "0b5e7c1a-2f3d-4e5f-8a9b-0c1d2e3f4a5b"
DOC = json.dumps({"nodeId": SELF, "members": [], "limits": {}})
TIMEOUT = 0.3  # the request_timeout of the clients these tests make
# How long a call may take against a hostile server: its request_timeout
# and a wide margin for a loaded machine. A client without the overall
# deadline takes as long as the server keeps it busy: until the test ends.
BOUND = 5.0
WAIT = 30.0  # the deadline of every wait on a condition

logging.getLogger("wlmclient").setLevel(logging.CRITICAL)


class RawServer:
    """A TCP server on a loopback port that reads each request's head and
    hands the connection to handler(conn, head). stop closes the listener
    and every connection, which ends every handler."""

    def __init__(self, handler):
        self.ln = socket.create_server(("127.0.0.1", 0))
        self.addr = "127.0.0.1:%d" % self.ln.getsockname()[1]
        self.handler, self.conns, self.lock = handler, [], threading.Lock()
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.ln.accept()
            except OSError:
                return
            with self.lock:
                self.conns.append(conn)
                self.accepted += 1
                n = self.accepted
            threading.Thread(target=self._serve, args=(conn, n), daemon=True).start()

    def _serve(self, conn, n):
        head = b""
        try:
            while b"\r\n\r\n" not in head:
                b = conn.recv(4096)
                if not b:
                    return
                head += b
            self.handler(conn, head, n)
        except OSError:
            pass
        finally:
            conn.close()

    def stop(self):
        self.ln.close()
        with self.lock:
            for c in self.conns:
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                c.close()


def dribble(conn, first, piece):
    """Write first, then piece every 50 ms until the client hangs up."""
    conn.sendall(first)
    while True:
        time.sleep(0.05)
        conn.sendall(piece)


def silent(conn, head, n):
    """Read on and answer nothing, until the connection ends."""
    while conn.recv(4096):
        pass


class Recorder:
    """A second server on loopback that answers like the node and counts what
    reaches it: a client that followed a redirect to it would take it."""

    def __init__(self):
        rec = self
        self.hits = 0

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def answer(self):
                rec.hits += 1
                b = DOC.encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(b)))
                self.end_headers()
                self.wfile.write(b)

            do_GET = do_POST = answer

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.srv.daemon_threads = True
        self.url = "http://127.0.0.1:%d" % self.srv.server_address[1]
        threading.Thread(target=self.srv.serve_forever, args=(0.05,), daemon=True).start()

    def stop(self):
        self.srv.shutdown()
        self.srv.server_close()


class HostileTest(unittest.TestCase):
    def serve(self, handler):
        s = RawServer(handler)
        self.addCleanup(s.stop)
        return s

    def answering(self, status, headers, body):
        """A server answering every request with status, headers and body."""
        head = "HTTP/1.1 %d X\r\n" % status + "".join("%s: %s\r\n" % kv for kv in headers.items())
        answer = (head + "Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body)).encode() + body.encode()
        return self.serve(lambda conn, head, n: conn.sendall(answer))

    def client(self, addr, **kw):
        kw.setdefault("request_timeout", TIMEOUT)
        kw.setdefault("max_attempts", 1)
        kw.setdefault("lease", None)
        kw.setdefault("backoff_min", 0.01)
        kw.setdefault("backoff_max", 0.05)
        c = wlmclient.Client(addr=addr, **kw)
        self.addCleanup(lambda: c._closed or c.close(timeout=2))
        return c

    def timed(self, what, f):
        """Run f on a thread of its own; fail when it takes longer than BOUND,
        without waiting for a call that never returns. Returns f's result or
        the exception it raised, and logs the time it took."""
        out = []

        def call():
            try:
                out.append(f())
            except Exception as e:  # noqa: BLE001 - the caller checks what it was
                out.append(e)
        start = time.monotonic()
        t = threading.Thread(target=call, daemon=True)
        t.start()
        t.join(BOUND)
        took = time.monotonic() - start
        self.assertFalse(t.is_alive(), "%s did not return within %.1f s" % (what, BOUND))
        print("%s: %.3f s" % (what, took))
        return out[0]

    def settle(self, c):
        """Submit one job and wait, within BOUND, until its frame left the queue."""
        j = c.submit("m", "e")

        def wait():
            deadline = time.monotonic() + WAIT
            while c.stats().queued > 0 and time.monotonic() < deadline:
                time.sleep(0.005)
        self.timed("a frame against a hostile server", wait)
        return j

    def test_slow_headers_are_cut_off_at_the_request_timeout(self):
        s = self.serve(lambda conn, head, n: dribble(conn, b"HTTP/1.1 200 OK\r\n", b"X-Slow: a\r\n"))
        c = self.client(s.addr)
        err = self.timed("node() against headers a line at a time", c.node)
        self.assertIsInstance(err, wlmclient.WlmError)
        self.settle(c)
        st = c.stats()
        self.assertEqual((st.sent, st.dropped), (0, 1), st)

    def test_slow_body_is_cut_off_at_the_request_timeout(self):
        s = self.serve(lambda conn, head, n: dribble(
            conn, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{", b" "))
        c = self.client(s.addr)
        err = self.timed("node() against a body a byte at a time", c.node)
        self.assertIsInstance(err, wlmclient.WlmError)
        # A frame answered 200 was taken, however slowly the rest comes.
        self.settle(c)
        self.assertEqual(c.stats().sent, 1)

    def test_a_huge_body_is_read_no_further_than_its_bound(self):
        huge, chunk = 64 << 20, b" " * (64 << 10)

        def flood(conn, head, n):
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % huge)
            for _ in range(huge // len(chunk)):
                conn.sendall(chunk)
        s = self.serve(flood)
        # Only the bound on what is read may end this: the deadline is long.
        c = self.client(s.addr, request_timeout=60)
        tracemalloc.start()
        try:
            err = self.timed("node() against a 64 MiB answer", c.node)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        print("node() peak memory against a 64 MiB answer: %d KiB" % (peak >> 10))
        self.assertIsInstance(err, wlmclient.WlmError)
        self.assertIn("over 4194304 bytes", str(err))
        self.assertLess(peak, 32 << 20)
        self.settle(c)
        self.assertEqual(c.stats().sent, 1)

    def test_a_node_answer_that_is_not_the_nodes_document_is_refused(self):
        cases = [
            ("a page", {"Content-Type": "text/html"}, DOC, "not application/json"),
            ("no type", {}, DOC, "not application/json"),
            ("an empty object", {"Content-Type": "application/json"}, "{}", "names no node id"),
            ("no UUID", {"Content-Type": "application/json"}, '{"nodeId":"x","members":[],"limits":{}}', "names no node id"),
            ("no members", {"Content-Type": "application/json"}, '{"nodeId":"%s","limits":{}}' % SELF, "no members list"),
            ("no limits", {"Content-Type": "application/json"}, '{"nodeId":"%s","members":[]}' % SELF, "no limits object"),
            ("not an object", {"Content-Type": "application/json"}, "[1]", "not a JSON object"),
        ]
        for name, headers, body, want in cases:
            with self.subTest(name):
                c = self.client(self.answering(200, headers, body).addr)
                with self.assertRaisesRegex(wlmclient.WlmError, want):
                    c.node()
        c = self.client(self.answering(200, {"Content-Type": "application/json; charset=utf-8"}, DOC).addr)
        self.assertEqual(c.node()["nodeId"], SELF)

    def test_redirects_are_answers_never_followed(self):
        rec = Recorder()
        self.addCleanup(rec.stop)
        cases = [(302, rec.url + "/stolen"), (307, rec.url + "/stolen"), (308, rec.url + "/stolen"),
                 # TEST-NET-1: a client that followed would dial it and wait.
                 (307, "http://192.0.2.1/v1/workloads/events")]
        for status, to in cases:
            with self.subTest(status=status, to=to):
                c = self.client(self.answering(status, {"Location": to}, "moved").addr)
                j = self.settle(c)
                self.assertIsInstance(j.err, wlmclient.StatusError)
                self.assertEqual(j.err.status, status)
                self.assertIn("not followed", j.err.reason)
                st = c.stats()
                self.assertEqual((st.sent, st.refused), (0, 1), st)
                err = self.timed("node() answered %d" % status, c.node)
                self.assertIsInstance(err, wlmclient.StatusError)
                self.assertEqual(err.status, status)
        self.assertEqual(rec.hits, 0, "the redirects' target got requests")

    def test_a_connection_that_never_answers_holds_no_call_past_its_deadline(self):
        s = self.serve(silent)
        c = self.client(s.addr)
        err = self.timed("node() against a silent server", c.node)
        self.assertIsInstance(err, wlmclient.WlmError)
        # close's deadline cuts off a request in flight, whatever its own.
        c2 = self.client(s.addr, request_timeout=60, max_attempts=0)
        c2.submit("m", "e")
        deadline = time.monotonic() + WAIT
        while s.accepted < 2 and time.monotonic() < deadline:
            time.sleep(0.005)
        err = self.timed("close(timeout=0.5) with a frame in flight", lambda: c2.close(timeout=0.5))
        self.assertIsInstance(err, wlmclient.WlmError)
        c2._thread.join(BOUND)
        self.assertFalse(c2._thread.is_alive(), "the sender is still on the request close cut off")

    def test_a_stuck_request_holds_the_frames_behind_it_no_longer_than_its_deadline(self):
        def first_hangs(conn, head, n):
            if n == 1:
                return silent(conn, head, n)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        s = self.serve(first_hangs)
        c = self.client(s.addr, max_attempts=0)

        def both_sent():
            c.submit("m", "e")
            c.submit("m", "e")
            deadline = time.monotonic() + WAIT
            while c.stats().sent < 2 and time.monotonic() < deadline:
                time.sleep(0.005)
        self.timed("two jobs behind a stuck request", both_sent)
        self.assertEqual(c.stats().sent, 2)


if __name__ == "__main__":
    unittest.main()
