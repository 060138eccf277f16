"""The Python client's conformance producer (issue 23, item 5).

It drives wlmclient the way a real producer drives its reports (many jobs
at once, the steps of one job run back to back by whichever of several
threads takes them, leases, a member named for scheduledOn, an outbox) and
says on stdout, one JSON object a line, what it asked for and what each job
was meant to end as. cmd/devcluster's conformance test drives it (and its
Go twin, clients/go/internal/conformproducer, which has the same command
line and the same stdout protocol) against a two-node cluster, kills and
restarts it and the daemons, and checks that every job ends as meant on
both nodes.

    python3 clients/python/conformance_producer.py --addr 127.0.0.1:PORT \\
        --producer conf-py --outbox /tmp/conf-py.outbox --lease 10 --jobs 60 --member node-b

Standard library and wlmclient (from this file's directory), Python 3.9+.
"""

import argparse
import json
import logging
import os
import queue
import random
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wlmclient  # noqa: E402  (from this file's directory)

SUBMIT, START, END = 0, 1, 2
STEP_NAMES = ("submit", "start", "end")


class FlagError(Exception):
    """A bad or missing flag: one line naming it."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise FlagError(message)


def parse_flags(args):
    p = _Parser(prog="conformance_producer", add_help=False, allow_abbrev=False)
    p.add_argument("--addr", required=True)
    p.add_argument("--producer", required=True)
    p.add_argument("--outbox", required=True)
    p.add_argument("--lease", type=int, required=True)
    p.add_argument("--jobs", type=int, required=True)
    p.add_argument("--concurrency", type=int, default=16)
    # Required, but may be empty: a node whose GET /v1/node lists no
    # members (no cluster files) has no name to give.
    p.add_argument("--member", required=True)
    p.add_argument("--step-delay-ms", type=int, default=100)
    p.add_argument("--close-timeout", type=int, default=60)
    p.add_argument("--seed", type=int, default=None)
    o = p.parse_args(args)
    host, sep, port = o.addr.rpartition(":")
    if not sep or not host or not port:
        raise FlagError("--addr %r: not HOST:PORT" % o.addr)
    if not o.producer:
        raise FlagError("--producer: must not be empty")
    if not o.outbox:
        raise FlagError("--outbox: must not be empty")
    if not 5 <= o.lease <= 86400:
        raise FlagError("--lease %d: must be whole seconds from 5 to 86400" % o.lease)
    if o.jobs < 0:
        raise FlagError("--jobs %d: must not be negative" % o.jobs)
    if o.concurrency < 1:
        raise FlagError("--concurrency %d: must be at least 1" % o.concurrency)
    if o.step_delay_ms < 0:
        raise FlagError("--step-delay-ms %d: must not be negative" % o.step_delay_ms)
    if o.close_timeout < 1:
        raise FlagError("--close-timeout %d: must be at least 1" % o.close_timeout)
    if o.seed is None:
        o.seed = time.time_ns()
    return o


class Out:
    """The stdout protocol: one JSON object a line, whole lines, flushed."""

    def __init__(self, w):
        self._w = w
        self._lock = threading.Lock()  # guards _w: lines never interleave

    def line(self, **fields):
        s = json.dumps(fields, separators=(",", ":")) + "\n"
        with self._lock:
            self._w.write(s)
            self._w.flush()


def final(k):
    """The state job k is meant to end as."""
    return {1: "failed", 2: "cancelled", 3: "removed"}.get(k % 6, "completed")


def stats_line(out, c):
    s = c.stats()
    out.line(event="stats", queued=s.queued, sent=s.sent, retried=s.retried, refused=s.refused,
             dropped=s.dropped, outboxPending=s.outbox_pending, outboxFull=s.outbox_full)


class _Job:
    __slots__ = ("k", "step", "h")

    def __init__(self, k):
        self.k, self.step, self.h = k, SUBMIT, None


def run(args, stdout, stderr):
    try:
        o = parse_flags(args)
    except FlagError as e:
        stderr.write("conformance_producer: %s\n" % str(e).replace("\n", " "))
        stderr.flush()
        return 2
    stderr.write("conformance_producer: seed %d\n" % o.seed)
    try:
        c = wlmclient.Client(addr=o.addr, producer=o.producer, lease=o.lease, outbox_path=o.outbox)
    except (OSError, ValueError, wlmclient.WlmError) as e:
        stderr.write("conformance_producer: %s\n" % e)
        return 1
    out = Out(stdout)

    # The node may be restarting: ask until the close timeout.
    deadline = time.monotonic() + o.close_timeout
    while True:
        try:
            node = c.node()
            break
        except wlmclient.WlmError as e:
            if time.monotonic() > deadline:
                stderr.write("conformance_producer: %s\n" % e)
                try:
                    c.close(timeout=1)
                except wlmclient.WlmError:
                    pass
                return 1
            time.sleep(0.2)
    # The member's node id, for the "scheduledOn" the orchestrator checks,
    # from the client's own lookup (the one submit makes for
    # scheduled_on_member), not a scan of node["members"] of our own: the
    # producer then checks what producers use. The node() call above taught
    # it the members, so this asks the node nothing more.
    member_id = ""
    if o.member:
        try:
            member_id = c.member_id(o.member)
        except wlmclient.WlmError as e:
            # submit will say so for each job that names it.
            stderr.write("conformance_producer: %s\n" % e)
    out.line(event="node", nodeId=node.get("nodeId", ""), member=o.member, memberId=member_id)

    stop_stats = threading.Event()

    def report():
        while not stop_stats.wait(0.1):
            stats_line(out, c)

    reporter = threading.Thread(target=report, name="stats", daemon=True)
    reporter.start()

    if o.jobs == 0:
        # Only the outbox's replay: wait for it, within the close timeout.
        deadline = time.monotonic() + o.close_timeout
        while time.monotonic() < deadline:
            s = c.stats()
            if s.queued == 0 and s.outbox_pending == 0:
                break
            time.sleep(0.02)
        timeout = max(deadline - time.monotonic(), 0)
    else:
        run_jobs(c, out, o, member_id)
        timeout = o.close_timeout
    close_err = ""
    try:
        c.close(timeout=timeout)
    except wlmclient.WlmError as e:
        close_err = str(e)
    stop_stats.set()
    reporter.join()
    stats_line(out, c)
    out.line(event="done", closeErr=close_err)
    return 0


def run_jobs(c, out, o, member_id):
    """Run jobs 0..o.jobs-1, at most o.concurrency open at once, their steps
    taken from one queue by o.concurrency worker threads; return when every
    job ended (its end call returned, or a step failed)."""
    steps = queue.Queue()
    lock = threading.Lock()  # guards state and rng
    state = {"next": 0, "ended": 0}
    all_ended = threading.Event()
    rng = random.Random(o.seed)
    stop = object()

    with lock:
        while state["next"] < o.jobs and state["next"] < o.concurrency:
            steps.put(_Job(state["next"]))
            state["next"] += 1

    def finish():
        # Admit the next job in the place of one that ended.
        with lock:
            state["ended"] += 1
            if state["next"] < o.jobs:
                steps.put(_Job(state["next"]))
                state["next"] += 1
            if state["ended"] == o.jobs:
                all_ended.set()

    def later(j):
        # Hand j's next step to the workers after a random delay.
        with lock:
            d = rng.randint(0, o.step_delay_ms) / 1000.0
        if d == 0:
            steps.put(j)
            return
        t = threading.Timer(d, steps.put, (j,))
        t.daemon = True
        t.start()

    def worker():
        while True:
            j = steps.get()
            if j is stop:
                return
            if step(c, out, j, o.member, member_id):
                finish()
            else:
                later(j)

    workers = [threading.Thread(target=worker, name="worker-%d" % i, daemon=True)
               for i in range(o.concurrency)]
    for t in workers:
        t.start()
    all_ended.wait()
    for _ in workers:
        steps.put(stop)
    for t in workers:
        t.join()


def step(c, out, j, member, member_id):
    """Run j's current step; True when the job ended."""
    try:
        if j.step == SUBMIT:
            on = member if j.k % 4 == 3 and member else None
            j.h = c.submit(model="conformance", engine="test", scheduled_on_member=on)
            out.line(event="submitted", id=j.h.id, scheduledOn=member_id if on else "")
        elif j.step == START:
            j.h.start()
        else:
            # Said before the call, so a kill between the call and its
            # "meant" line still tells the orchestrator which end was under
            # way (the outbox may hold it).
            out.line(event="ending", id=j.h.id, final=final(j.k))
            kind = j.k % 6
            if kind == 1:
                j.h.fail("conformance")
            elif kind == 2:
                j.h.cancel("conformance")
            elif kind == 3:
                j.h.remove()
            else:
                j.h.complete()
            out.line(event="meant", id=j.h.id, final=final(j.k))
            return True
    except Exception as e:  # any failure of the call abandons the job
        out.line(event="stepError", id=j.h.id if j.h is not None else "", step=STEP_NAMES[j.step],
                 err=str(e) or type(e).__name__)
        return True
    j.step += 1
    if j.step == START and j.k % 6 == 5:
        j.step = END  # completed straight from queued
    return False


def main():
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.exit(run(sys.argv[1:], sys.stdout, sys.stderr))


if __name__ == "__main__":
    main()
