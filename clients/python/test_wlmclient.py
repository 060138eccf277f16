"""Unit tests of wlmclient against a tiny in-process fake of the ingress.

Run: python3 -m unittest discover clients/python
"""

import json
import logging
import os
import tempfile
import threading
import time
import unittest
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import wlmclient

WAIT = 30.0  # the deadline of every wait on a condition
SELF = "0b5e7c1a-2f3d-4e5f-8a9b-0c1d2e3f4a5b"  # the node id the fakes answer GET /v1/node with

# The client's warnings are what the tests provoke; assertLogs still sees them.
logging.getLogger("wlmclient").setLevel(logging.CRITICAL)


def eventually(test, what, cond):
    deadline = time.monotonic() + WAIT
    while not cond():
        if time.monotonic() > deadline:
            test.fail("never happened within %ss: %s" % (WAIT, what))
        time.sleep(0.01)


def holds_throughout(cond, seconds):
    """Whether cond holds at every check for seconds. It can only pass
    wrongly (a change after the window), never fail wrongly."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not cond():
            return False
        time.sleep(0.01)
    return cond()


class Fake:
    """An ingress fake: answers POSTs with scripted (status, headers, body)
    answers (then 200), records each request, and flags two frames of one
    job in flight at once."""

    def __init__(self):
        self.lock = threading.Lock()
        self.script = []          # answers to give, in order
        self.requests = []        # (frame dict, headers dict)
        self.inflight = {}        # job id -> requests in flight
        self.overlap = False
        self.hold = None          # an Event every POST waits on, if set
        self.rule = None          # frame -> an answer or None, asked before the script
        self.drop = 0             # POSTs to leave unanswered, the connection closed (-1: all)
        self.node = {"nodeId": SELF, "limits": {}, "members": [{"name": "gpu-a", "nodeId": "n-a", "self": False,
                                                     "delivering": True}]}
        self.node_gets = 0        # GET /v1/node requests seen
        fake = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                with fake.lock:
                    fake.node_gets += 1
                if fake.node is None:  # the daemon restarting
                    self.send_error(503)
                    return
                b = json.dumps(fake.node).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(b)))
                self.end_headers()
                self.wfile.write(b)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                p = body["params"]
                jid = p["workloadInfo"]["id"] if "workloadInfo" in p else p["workloadId"]
                with fake.lock:
                    fake.inflight[jid] = fake.inflight.get(jid, 0) + 1
                    if fake.inflight[jid] > 1:
                        fake.overlap = True
                    fake.requests.append((body, dict(self.headers)))
                    if fake.drop:
                        fake.drop -= fake.drop > 0
                        fake.inflight[jid] -= 1
                        self.close_connection = True
                        return
                    answer = fake.rule(body) if fake.rule is not None else None
                    if answer is None:
                        answer = fake.script.pop(0) if fake.script else (200, {}, "ok")
                if fake.hold is not None:
                    fake.hold.wait(WAIT)
                status, headers, text = answer
                b = (text + "\n").encode()
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(b)))
                self.end_headers()
                try:
                    self.wfile.write(b)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up on the request (close's deadline cuts it off)
                with fake.lock:
                    fake.inflight[jid] -= 1

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.srv.daemon_threads = True
        self.addr = "127.0.0.1:%d" % self.srv.server_address[1]
        threading.Thread(target=self.srv.serve_forever, args=(0.05,), daemon=True).start()

    def stop(self):
        if self.hold is not None:
            self.hold.set()
        self.srv.shutdown()
        self.srv.server_close()

    def frames(self):
        with self.lock:
            return [b for b, _ in self.requests]


class Base(unittest.TestCase):
    def setUp(self):
        self.fake = Fake()
        self.addCleanup(self.fake.stop)
        self.clients = []

    def client(self, **kw):
        kw.setdefault("addr", self.fake.addr)
        kw.setdefault("lease", None)
        kw.setdefault("backoff_min", 0.01)
        kw.setdefault("backoff_max", 0.05)
        c = wlmclient.Client(**kw)
        self.addCleanup(lambda: c._closed or c.close(timeout=5))
        return c

    def recorded_waits(self, c):
        """Record each retry's wait and retry at once instead."""
        waits = []
        c._park_for = lambda d: waits.append(d) or 0
        return waits


class RetryTest(Base):
    def test_5xx_408_429_are_retried_and_retry_after_seconds_is_honoured(self):
        self.fake.script = [(503, {"Retry-After": "7"}, "busy"), (408, {}, "slow"),
                            (429, {"Retry-After": "2"}, "later"), (500, {}, "oops")]
        c = self.client()
        waits = self.recorded_waits(c)
        c.submit("m", "e")
        c.close(timeout=WAIT)
        self.assertEqual(len(self.fake.frames()), 5)
        self.assertEqual(c.stats().sent, 1)
        self.assertEqual(c.stats().retried, 4)
        self.assertTrue(7 <= waits[0] <= 7 * 1.25, waits)
        self.assertTrue(waits[1] <= 0.05, waits)  # backoff, capped
        self.assertTrue(2 <= waits[2] <= 2.5, waits)

    def test_retry_after_as_an_http_date_is_honoured(self):
        self.fake.script = [(503, {"Retry-After": formatdate(time.time() + 60, usegmt=True)}, "busy")]
        c = self.client()
        waits = self.recorded_waits(c)
        c.submit("m", "e")
        c.close(timeout=WAIT)
        self.assertTrue(58 <= waits[0] <= 60 * 1.25 + 1, waits)

    def test_retry_after_is_capped(self):
        self.fake.script = [(503, {"Retry-After": "100000"}, "busy")]
        c = self.client(retry_after_max=10)
        waits = self.recorded_waits(c)
        c.submit("m", "e")
        c.close(timeout=WAIT)
        self.assertTrue(10 <= waits[0] <= 12.5, waits)

    def test_backoff_doubles_to_its_cap(self):
        self.fake.script = [(502, {}, "x")] * 6
        c = self.client(backoff_min=1, backoff_max=4)
        waits = self.recorded_waits(c)
        c.submit("m", "e")
        c.close(timeout=WAIT)
        for w, hi in zip(waits, [1, 2, 4, 4, 4, 4]):
            self.assertTrue(hi / 2 <= w <= hi, waits)

    def test_other_4xx_are_never_retried(self):
        for status in (400, 403, 404, 405, 413, 415, 421):
            with self.subTest(status=status):
                fake = Fake()
                self.addCleanup(fake.stop)
                fake.script = [(status, {"Retry-After": "1"}, "fix the producer")]
                c = self.client(addr=fake.addr)
                self.recorded_waits(c)
                j = c.submit("m", "e")
                j.start()
                c.close(timeout=WAIT)
                self.assertEqual(len(fake.frames()), 2)  # the refused one once, then the next frame
                s = c.stats()
                self.assertEqual((s.refused, s.retried, s.sent), (1, 0, 1))
                self.assertIsInstance(j.err, wlmclient.StatusError)
                self.assertEqual(j.err.status, status)

    def test_a_409_ends_the_job(self):
        self.fake.script = [(409, {}, "the broker owns it")]
        self.fake.hold = threading.Event()
        c = self.client()
        j = c.submit("m", "e")
        j.start()  # queued behind the submitted frame, dropped once it is owned
        self.fake.hold.set()
        eventually(self, "the 409 taken", lambda: j.err is not None)
        eventually(self, "the queue empty", lambda: c.stats().queued == 0)
        with self.assertRaises(wlmclient.OwnedError):
            j.complete()
        c.close(timeout=WAIT)
        self.assertEqual(len(self.fake.frames()), 1)
        self.assertEqual(c.stats().dropped, 1)

    def test_a_job_waiting_for_its_retry_does_not_hold_back_the_frames_that_would_free_its_slot(self):
        # The daemon at --max-live-workloads 1: while job A lives, a new
        # job's first frame is refused 503 with Retry-After; A's completed
        # frame ends A's run and (once its retention passed) frees the
        # slot. A client whose only sender waited on B's retry would never
        # send A's end: a livelock until A's lease ran out.
        a_id, b_id = wlmclient.new_id("a"), wlmclient.new_id("b")
        refusals = []

        def live_limit(frame):
            w = frame["params"]["workloadInfo"]
            if w["id"] != b_id:
                return None
            if not any(f["params"]["workloadInfo"]["id"] == a_id and f["params"]["workloadInfo"]["state"] == "completed"
                       for f, _ in self.fake.requests):
                refusals.append(w["seq"])
                return (503, {"Retry-After": "1"}, "this node holds 1 workloads, its limit (--max-live-workloads)")
            return None

        self.fake.rule = live_limit
        c = self.client()
        a = c.submit("m", "e", id=a_id)
        eventually(self, "A's queued frame taken", lambda: c.stats().sent == 1)
        c.submit("m", "e", id=b_id)
        eventually(self, "B's queued frame refused at the limit", lambda: len(refusals) >= 1)
        a.complete()

        def states():
            return [(f["params"]["workloadInfo"]["id"], f["params"]["workloadInfo"]["state"]) for f in self.fake.frames()]

        eventually(self, "A's completed frame sent while B waits for its retry",
                   lambda: (a_id, "completed") in states())
        eventually(self, "B's queued frame taken", lambda: c.stats().sent == 3)
        c.close(timeout=WAIT)
        got = states()
        self.assertEqual([s for s in got if s[0] == a_id], [(a_id, "queued"), (a_id, "completed")])
        self.assertLess(got.index((a_id, "completed")), len(got) - 1)
        self.assertEqual(got[-1], (b_id, "queued"))  # taken only after A's end
        s = c.stats()
        self.assertGreaterEqual(s.retried, 1)
        self.assertEqual((s.sent, s.dropped, s.refused, s.queued), (3, 0, 0, 0))

    def test_a_transport_error_holds_every_job_not_only_its_own(self):
        # Nothing answers: one try per backoff for the whole client, not one
        # try per job (which, with one sender and a hung daemon, would cost
        # request_timeout per job per round).
        c, jobs, waits = self.ten_jobs_tried_once_against_a_daemon_that_never_answers()
        self.assertEqual((c.stats().dropped, c.stats().retried), (len(jobs), 0))
        self.assertEqual(len(waits), 1)

    def ten_jobs_tried_once_against_a_daemon_that_never_answers(self, **kw):
        """Ten jobs against a daemon that answers nothing, every hold an
        hour: exactly one try goes out; then close gives up on them all.
        Returns the client, the jobs and the holds it took."""
        self.fake.drop = -1
        c = self.client(**kw)
        waits = []
        c._park_for = lambda d: waits.append(d) or 3600
        jobs = [c.submit("m", "e") for _ in range(10)]
        eventually(self, "the first try", lambda: len(self.fake.requests) >= 1)
        self.assertTrue(holds_throughout(lambda: len(self.fake.requests) == 1, 0.5),
                        "%d tries after the first transport error, want 1" % len(self.fake.requests))
        with self.assertRaises(wlmclient.WlmError):
            c.close(timeout=0.1)
        return c, jobs, waits

    def test_a_frame_whose_last_attempt_gets_no_answer_still_holds_the_client(self):
        # With max_attempts=1 every frame's try is its last: the hold must
        # still be taken, or ten jobs make ten tries at a daemon that is down.
        c, jobs, _ = self.ten_jobs_tried_once_against_a_daemon_that_never_answers(max_attempts=1)
        self.assertEqual(c.stats().dropped, len(jobs))

    def test_after_a_transport_error_every_job_goes_on_when_the_daemon_answers(self):
        self.fake.drop = 1
        c = self.client()
        waits = []
        c._park_for = lambda d: waits.append(d) or 0.01
        jobs = [c.submit("m", "e") for _ in range(10)]
        for j in jobs:
            j.complete()
        c.close(timeout=WAIT)
        s = c.stats()
        self.assertEqual((s.sent, s.retried, s.dropped), (20, 1, 0))
        self.assertTrue(waits[0] <= 0.01, waits)  # backoff_min, jittered down
        for j in jobs:
            got = [f["params"]["workloadInfo"]["seq"] for f in self.fake.frames()
                   if f["params"]["workloadInfo"]["id"] == j.id]
            self.assertEqual(got[-2:], [1, 2])

    def test_max_attempts_gives_up(self):
        self.fake.script = [(503, {}, "busy")] * 5
        c = self.client(max_attempts=3)
        self.recorded_waits(c)
        j = c.submit("m", "e")
        c.close(timeout=WAIT)
        self.assertEqual(len(self.fake.frames()), 3)
        self.assertEqual(c.stats().dropped, 1)
        self.assertEqual(j.err.status, 503)


class FrameTest(Base):
    def test_frames_carry_method_for_state_epoch_ms_and_rising_seq(self):
        c = self.client()
        j = c.submit("m", "e", extra={"tool": "x"})
        j.start()
        j.fail("boom")
        with self.assertRaises(wlmclient.JobEndedError):
            j.complete()
        c.close(timeout=WAIT)
        got = [(f["method"], f["params"]["workloadInfo"]["state"], f["params"]["workloadInfo"]["seq"])
               for f in self.fake.frames()]
        self.assertEqual(got, [("workload:submitted", "queued", 1), ("workload:started", "running", 2),
                               ("workload:errored", "failed", 3)])
        w = self.fake.frames()[-1]["params"]["workloadInfo"]
        now = time.time() * 1000
        for k in ("createdAt", "startedAt", "completedAt"):
            self.assertTrue(now - 60000 < w[k] <= now + 1, (k, w[k]))
        self.assertEqual((w["error"], w["tool"], w["runId"]), ("boom", "x", j.id))
        self.assertNotIn("originatedFrom", w)
        c = self.client()
        c.submit("m", "e").complete()
        c.submit("m", "e").cancel("stop")
        c.close(timeout=WAIT)
        got = {}
        for f in self.fake.frames()[3:]:
            w = f["params"]["workloadInfo"]
            got.setdefault(w["id"], []).append((f["method"], w["state"]))
        self.assertEqual(sorted(got.values()), [
            [("workload:submitted", "queued"), ("workload:completed", "completed")],
            [("workload:submitted", "queued"), ("workload:errored", "cancelled")]])

    def test_extra_may_not_shadow_a_workload_field(self):
        c = self.client()
        with self.assertRaises(wlmclient.WlmError):
            c.submit("m", "e", extra={"SEQ": 1})

    def test_ids_differ_and_name_the_process(self):
        ids = {wlmclient.new_id("p") for _ in range(1000)}
        self.assertEqual(len(ids), 1000)
        self.assertIn("-%d-" % os.getpid(), next(iter(ids)))
        self.assertLess(len(wlmclient.new_id("x" * 1000)), 256)

    def test_scheduled_on_member_by_name(self):
        c = self.client()
        c.submit("m", "e", scheduled_on_member="gpu-a")
        with self.assertRaises(wlmclient.WlmError):
            c.submit("m", "e", scheduled_on_member="nobody")
        self.assertEqual(c.node()["nodeId"], SELF)
        c.close(timeout=WAIT)
        self.assertEqual(self.fake.frames()[0]["params"]["workloadInfo"]["scheduledOn"], "n-a")

    def test_a_member_name_learned_once_is_resolved_while_the_node_does_not_answer(self):
        # A submit naming a member queues like any other while the daemon is
        # away, instead of failing for a node id that does not change; a name
        # never learned still needs the node.
        c = self.client()
        c.submit("m", "e", scheduled_on_member="gpu-a")
        self.fake.node = None
        gets = self.fake.node_gets
        c.submit("m", "e", scheduled_on_member="gpu-a")
        self.assertEqual(self.fake.node_gets, gets, "a member learned just now was asked for again")
        c._members_at -= 2 * wlmclient.MEMBER_FRESH
        c.submit("m", "e", scheduled_on_member="gpu-a")
        self.assertEqual(self.fake.node_gets, gets + 1, "a member learned long ago was not asked for once")
        with self.assertRaises(wlmclient.WlmError):
            c.submit("m", "e", scheduled_on_member="gpu-b")
        # A restarted daemon answers no members until its first discovery
        # snapshot: that teaches nothing.
        self.fake.node = {"nodeId": SELF, "limits": {}, "members": []}
        c._members_at -= 2 * wlmclient.MEMBER_FRESH
        c.submit("m", "e", scheduled_on_member="gpu-a")
        # Of two members of one name the first listed wins, asked or cached.
        self.fake.node = {"nodeId": SELF, "limits": {}, "members": [{"name": "gpu-c", "nodeId": "n-c1"},
                                                          {"name": "gpu-c", "nodeId": "n-c2"}]}
        self.assertEqual([c.member_id("gpu-c") for _ in range(2)], ["n-c1", "n-c1"])
        c.close(timeout=WAIT)
        self.assertEqual([f["params"]["workloadInfo"]["scheduledOn"] for f in self.fake.frames()], ["n-a"] * 4)

    def test_frames_requested_from_many_threads_go_one_at_a_time_per_job_in_seq_order(self):
        c = self.client(queue_size=100000)
        jobs = [c.submit("m", "e") for _ in range(10)]
        barrier = threading.Barrier(8)

        def hammer():
            barrier.wait()
            for _ in range(10):
                for j in jobs:
                    j.start()

        ts = [threading.Thread(target=hammer) for _ in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        for j in jobs:
            j.complete()
        c.close(timeout=120)
        self.assertFalse(self.fake.overlap)
        seqs = {}
        for f in self.fake.frames():
            w = f["params"]["workloadInfo"]
            seqs.setdefault(w["id"], []).append(w["seq"])
        for j in jobs:
            self.assertEqual(seqs[j.id], list(range(1, 8 * 10 + 3)), j.id)

    def test_lease_is_armed_renewed_and_ended_by_the_terminal_frame(self):
        c = self.client(lease=6)
        c._renew_every = 0.05
        j = c.submit("m", "e")
        j.start()
        eventually(self, "two renewals", lambda: len(self.fake.requests) >= 4)
        j.complete()
        c.close(timeout=WAIT)
        reqs = list(self.fake.requests)
        for body, h in reqs[:-1]:
            self.assertEqual(h.get("Workload-Lease"), "6")
            self.assertEqual(body["params"]["workloadInfo"]["state"] in ("queued", "running"), True)
        self.assertNotIn("Workload-Lease", reqs[-1][1])
        self.assertEqual(reqs[-1][0]["params"]["workloadInfo"]["state"], "completed")
        renewals = [b for b, _ in reqs if b["params"]["workloadInfo"]["seq"] == 2]
        self.assertGreaterEqual(len(renewals), 2)  # the started frame, then renewals of it, same seq
        n = len(self.fake.requests)
        time.sleep(0.2)  # no renewal may follow the terminal frame
        self.assertEqual(len(self.fake.requests), n)

    def test_a_proxy_in_the_environment_is_not_used(self):
        old = {k: os.environ.get(k) for k in ("http_proxy", "HTTP_PROXY", "no_proxy", "NO_PROXY")}
        os.environ.update(http_proxy="http://127.0.0.1:9", HTTP_PROXY="http://127.0.0.1:9", no_proxy="", NO_PROXY="")
        try:
            c = self.client(max_attempts=1)
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        c.submit("m", "e")
        c.close(timeout=WAIT)
        self.assertEqual((c.stats().sent, len(self.fake.frames())), (1, 1))

    def test_a_bad_lease_is_refused(self):
        for lease in (1, 4, 86401, 7.5):
            with self.assertRaises(ValueError):
                wlmclient.Client(addr=self.fake.addr, lease=lease)


class QueueTest(Base):
    def test_the_queue_is_bounded_and_a_refused_frame_leaves_the_job_as_it_was(self):
        self.fake.hold = threading.Event()
        c = self.client(queue_size=3)
        j = c.submit("m", "e")      # in flight, held
        eventually(self, "the first frame in flight", lambda: len(self.fake.requests) == 1)
        j.start()
        k = c.submit("m", "e")
        with self.assertRaises(wlmclient.QueueFullError):
            j.complete()
        self.assertEqual(c.stats().dropped, 1)
        self.assertEqual(c.stats().queued, 3)
        self.fake.hold.set()
        eventually(self, "room again", lambda: c.stats().queued == 0)
        j.complete()                # its seq was not used by the dropped frame
        k.complete()
        c.close(timeout=WAIT)
        seqs = [f["params"]["workloadInfo"]["seq"] for f in self.fake.frames()
                if f["params"]["workloadInfo"]["id"] == j.id]
        self.assertEqual(seqs, [1, 2, 3])


class CloseTest(Base):
    def test_close_returns_at_its_deadline_when_the_daemon_does_not_answer(self):
        self.fake.hold = threading.Event()
        c = self.client(request_timeout=120)
        c.submit("m", "e").complete()
        eventually(self, "a frame in flight", lambda: len(self.fake.requests) == 1)
        t0 = time.monotonic()
        with self.assertRaises(wlmclient.WlmError) as cm:
            c.close(timeout=0.2)
        self.assertLess(time.monotonic() - t0, 60)  # not the request's 120 s timeout
        self.assertIn("2 frame(s) not sent", str(cm.exception))
        self.assertEqual(c.stats().dropped, 2)
        with self.assertRaises(wlmclient.ClosedError):
            c.submit("m", "e")

    def test_close_flushes(self):
        c = self.client()
        for _ in range(50):
            j = c.submit("m", "e")
            j.start()
            j.complete()
        c.close(timeout=WAIT)
        self.assertEqual(c.stats().sent, 150)
        self.assertEqual(len(self.fake.frames()), 150)


class OutboxTest(Base):
    def setUp(self):
        super().setUp()
        d = tempfile.mkdtemp()
        self.path = os.path.join(d, "outbox.jsonl")

    def dead_addr(self):
        f = Fake()
        addr = f.addr
        f.stop()  # nothing listens there now: every try is refused
        return addr

    def test_terminal_frames_survive_a_restart(self):
        c = self.client(addr=self.dead_addr(), outbox_path=self.path)
        self.recorded_waits(c)
        c._park_for = lambda d: 0.01
        j = c.submit("m", "e")
        j.complete()
        k = c.submit("m", "e")
        k.remove()
        self.assertEqual(c.stats().outbox_pending, 2)
        with self.assertRaises(wlmclient.WlmError):
            c.close(timeout=0.1)
        # A restarted producer sends what the outbox kept, once.
        c2 = self.client(outbox_path=self.path)
        c2.close(timeout=WAIT)
        got = sorted((f["method"], f["params"].get("workloadId") or f["params"]["workloadInfo"]["id"])
                     for f in self.fake.frames())
        self.assertEqual(got, sorted([("workload:completed", j.id), ("workloads:remove", k.id)]))
        self.assertEqual(c2.stats().outbox_pending, 0)
        c3 = self.client(outbox_path=self.path)
        c3.close(timeout=WAIT)
        self.assertEqual(len(self.fake.frames()), 2)

    def test_a_torn_file_is_a_warning_and_a_fresh_start(self):
        good = {"key": "a\x002", "id": "a", "method": "workload:completed",
                "body": json.dumps({"jsonrpc": "2.0", "method": "workload:completed",
                                    "params": {"workloadInfo": {"id": "a", "seq": 2}}})}
        with open(self.path, "w") as f:
            f.write(json.dumps(good) + "\n" + '{"key": "b", "id": "b", "meth')
        with self.assertLogs("wlmclient", "WARNING"):
            c = self.client(outbox_path=self.path)
        c.close(timeout=WAIT)
        self.assertEqual(c.stats().outbox_torn, 1)
        self.assertEqual([f["params"]["workloadInfo"]["id"] for f in self.fake.frames()], ["a"])
        with open(self.path, "wb") as f:
            f.write(b"\x00\xff garbage")
        with self.assertLogs("wlmclient", "WARNING"):
            c = self.client(outbox_path=self.path)
        c.close(timeout=WAIT)
        self.assertEqual(c.stats().outbox_torn, 1)

    def test_the_outbox_is_bounded(self):
        c = self.client(addr=self.dead_addr(), outbox_path=self.path, outbox_max=2)
        c._park_for = lambda d: 0.01
        for _ in range(3):
            c.submit("m", "e").complete()
        s = c.stats()
        self.assertEqual((s.outbox_pending, s.outbox_full), (2, 1))
        with self.assertRaises(wlmclient.WlmError):
            c.close(timeout=0.1)
        with open(self.path) as f:
            self.assertEqual(len(f.read().splitlines()), 2)


if __name__ == "__main__":
    unittest.main()
