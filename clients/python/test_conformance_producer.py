"""Smoke tests of conformance_producer against a tiny in-process ingress.

Run: python3 -m unittest discover clients/python
"""

import io
import json
import logging
import os
import tempfile
import threading
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import conformance_producer

SELF = "0b5e7c1a-2f3d-4e5f-8a9b-0c1d2e3f4a5b"  # the node id the fake answers GET /v1/node with

logging.getLogger("wlmclient").setLevel(logging.CRITICAL)

GOOD = ["--addr", "127.0.0.1:1", "--producer", "p", "--outbox", "/tmp/x", "--lease", "10",
        "--jobs", "1", "--member", ""]


class FlagErrors(unittest.TestCase):
    def test_a_bad_flag_is_one_line_naming_it_and_exit_2(self):
        cases = [
            ("missing addr", GOOD[2:], "--addr"),
            ("missing member", GOOD[:10], "--member"),
            ("bad addr", ["--addr", "nope"] + GOOD[2:], "--addr"),
            ("lease too short", GOOD + ["--lease", "4"], "--lease"),
            ("lease not a number", GOOD + ["--lease", "10s"], "--lease"),
            ("negative jobs", GOOD + ["--jobs", "-1"], "--jobs"),
            ("zero concurrency", GOOD + ["--concurrency", "0"], "--concurrency"),
            ("negative step delay", GOOD + ["--step-delay-ms", "-1"], "--step-delay-ms"),
            ("zero close timeout", GOOD + ["--close-timeout", "0"], "--close-timeout"),
            ("unknown flag", GOOD + ["--bogus"], "--bogus"),
            ("no value", GOOD + ["--seed"], "--seed"),
        ]
        for name, args, flag in cases:
            with self.subTest(name):
                stdout, stderr = io.StringIO(), io.StringIO()
                self.assertEqual(conformance_producer.run(args, stdout, stderr), 2, stderr.getvalue())
                msg = stderr.getvalue()
                self.assertEqual(msg.count("\n"), 1, msg)
                self.assertTrue(msg.endswith("\n"), msg)
                self.assertIn(flag, msg)
                self.assertEqual(stdout.getvalue(), "")


class Ingress:
    """Answers GET /v1/node and every POST 200; records each job's frames in
    arrival order."""

    def __init__(self):
        self.lock = threading.Lock()
        self.frames = {}  # job id -> frames in arrival order
        ingress = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def answer(self, status, body):
                b = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(b)))
                self.end_headers()
                self.wfile.write(b)

            def do_GET(self):
                if self.path != "/v1/node":
                    return self.answer(404, "not found\n")
                self.answer(200, json.dumps({"nodeId": SELF, "limits": {}, "members": [
                    {"name": "self", "nodeId": SELF, "self": True, "delivering": False},
                    {"name": "gpu-b", "nodeId": "n-b", "self": False, "delivering": True}]}))

            def do_POST(self):
                f = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                p = f["params"]
                jid = p["workloadInfo"]["id"] if "workloadInfo" in p else p["workloadId"]
                with ingress.lock:
                    ingress.frames.setdefault(jid, []).append(f)
                self.answer(200, "ok\n")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.addr = "127.0.0.1:%d" % self.server.server_address[1]

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


class ARun(unittest.TestCase):
    def setUp(self):
        self.ingress = Ingress()
        self.addCleanup(self.ingress.stop)
        d = tempfile.TemporaryDirectory()
        self.addCleanup(d.cleanup)
        self.outbox = os.path.join(d.name, "outbox")

    def test_a_member_the_node_does_not_list_has_no_id(self):
        # The member's id comes from the client's own lookup (member_id); a
        # name the node does not list leaves memberId empty, says so on
        # stderr, and the run goes on.
        stdout, stderr = io.StringIO(), io.StringIO()
        args = ["--addr", self.ingress.addr, "--producer", "conf-test", "--outbox", self.outbox,
                "--lease", "10", "--jobs", "0", "--member", "gpu-z"]
        self.assertEqual(conformance_producer.run(args, stdout, stderr), 0, stderr.getvalue())
        first = json.loads(stdout.getvalue().splitlines()[0])
        self.assertEqual(first, {"event": "node", "nodeId": SELF, "member": "gpu-z", "memberId": ""})
        self.assertIn("no member named 'gpu-z'", stderr.getvalue())

    def test_a_run_prints_the_protocol_and_each_jobs_frames_arrive_in_seq_order(self):
        stdout, stderr = io.StringIO(), io.StringIO()
        args = ["--addr", self.ingress.addr, "--producer", "conf-test", "--outbox", self.outbox,
                "--lease", "10", "--jobs", "12", "--concurrency", "4", "--member", "gpu-b",
                "--step-delay-ms", "5", "--seed", "1"]
        self.assertEqual(conformance_producer.run(args, stdout, stderr), 0, stderr.getvalue())
        lines = [json.loads(line) for line in stdout.getvalue().splitlines()]
        self.assertGreaterEqual(len(lines), 2)
        self.assertEqual(lines[0], {"event": "node", "nodeId": SELF, "member": "gpu-b", "memberId": "n-b"})
        self.assertEqual(lines[-1], {"event": "done", "closeErr": ""})
        s = lines[-2]
        self.assertEqual(s["event"], "stats")
        # 12 jobs: 12 submitted, 10 started (k%6 == 5 skips it), 12 ended; a
        # lease renewal (after 10/3 s on a slow machine) adds one more.
        self.assertGreaterEqual(s["sent"], 34, s)
        for k in ("queued", "refused", "dropped", "outboxPending", "outboxFull"):
            self.assertEqual(s[k], 0, s)

        submitted, meant, ending = {}, {}, {}
        for line in lines[1:-1]:
            ev = line["event"]
            if ev == "submitted":
                submitted[line["id"]] = line["scheduledOn"]
            elif ev == "ending":
                ending[line["id"]] = line["final"]
            elif ev == "meant":
                self.assertIn(line["id"], submitted, "meant before submitted")
                meant[line["id"]] = line["final"]
                self.assertEqual(ending.get(line["id"]), line["final"], "meant without its ending line first")
            else:
                self.assertEqual(ev, "stats", line)
        self.assertEqual(len(submitted), 12)
        self.assertEqual(len(meant), 12)
        # k = 0..11 by k%6: 0 completed, 1 failed, 2 cancelled, 3 removed,
        # 4 completed, 5 completed; k%4 == 3 (3, 7, 11) scheduled on gpu-b.
        finals = {}
        for fin in meant.values():
            finals[fin] = finals.get(fin, 0) + 1
        self.assertEqual(finals, {"completed": 6, "failed": 2, "cancelled": 2, "removed": 2})
        self.assertEqual(sum(1 for on in submitted.values() if on == "n-b"), 3)
        self.assertEqual(sum(1 for on in submitted.values() if on == ""), 9)

        with self.ingress.lock:
            frames = dict(self.ingress.frames)
        self.assertEqual(set(frames), set(meant))
        for jid, fs in frames.items():
            seq = 0
            for i, f in enumerate(fs):
                if f["method"] == "workloads:remove":
                    self.assertEqual(i, len(fs) - 1, "job %s: removal not last" % jid)
                    self.assertEqual(meant[jid], "removed")
                    continue
                wi = f["params"]["workloadInfo"]
                self.assertGreaterEqual(wi["seq"], seq, "job %s: frames out of order: %s" % (jid, fs))
                seq = wi["seq"]
                self.assertEqual(wi.get("scheduledOn", ""), submitted[jid])
                if i == len(fs) - 1:
                    self.assertEqual(wi["state"], meant[jid])


if __name__ == "__main__":
    unittest.main()
