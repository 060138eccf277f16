"""Report a producer's jobs to a nvpair-workload-manager node's ingress.

The Python counterpart of the Go package ``wlmclient`` (clients/go), with
the same semantics, standard library only (Python 3.9+):

- a :class:`Job` sends its frames in the order they were asked for, one at
  a time (never two frames of one job in flight), each with a rising
  ``seq``, the method that carries its state and times in epoch
  milliseconds;
- ids carry the producer's prefix, the host, the process id, the time and
  64 random bits, so two processes cannot mint the same id unless the
  caller names the id itself (``submit(..., id=...)``);
- queued and running frames carry a ``Workload-Lease`` that is renewed at a
  third of its length while the job lives, and the terminal frame ends it;
- a refused connection, a 5xx, a 408 or a 429 is retried with capped,
  jittered exponential backoff, waiting at least the daemon's
  ``Retry-After`` (seconds or an HTTP date); any other 4xx is final for
  that frame (a 409 for the whole job: the node's broker owns it);
- frames wait in a bounded in-memory queue; what was sent, retried,
  refused and dropped is counted in :meth:`Client.stats`;
- with ``outbox_path``, terminal frames are kept in a file until the daemon
  took them, and a restarted producer sends them again;
- :meth:`Client.close` flushes within the caller's deadline;
- :meth:`Client.node` reads this node's id, members and limits from
  ``GET /v1/node``, and ``scheduled_on_member`` names a member by name;
- every request has one deadline, ``request_timeout`` (10 s), for all of
  it: the connect, the request, the answer's headers and its body; and no
  redirect is ever followed: a 3xx is the answer, and the frame was not
  taken.

One sender thread per client sends every job's frames (docs/clients.md). A
frame waiting to be retried parks its job, not the thread: the other jobs'
frames go on meanwhile. A transport error (no answer at all: the daemon is
down) holds every job until a shared backoff passes, so a daemon that is
down costs one try per backoff, not one per job.
"""

import heapq
import io
import json
import logging
import os
import random
import re
import secrets
import socket
import tempfile
import threading
import time
import http.client
from collections import deque
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

__all__ = [
    "Client", "Job", "Stats", "new_id", "WlmError", "ClosedError", "QueueFullError",
    "JobEndedError", "OwnedError", "StatusError",
    "DEFAULT_ADDR", "DEFAULT_LEASE", "DEFAULT_QUEUE_SIZE", "DEFAULT_OUTBOX_MAX",
]

DEFAULT_ADDR = "127.0.0.1:14324"
DEFAULT_LEASE = 30  # seconds
DEFAULT_QUEUE_SIZE = 1024
DEFAULT_BACKOFF_MIN = 0.2
DEFAULT_BACKOFF_MAX = 30.0
DEFAULT_RETRY_AFTER_MAX = 300.0
DEFAULT_REQUEST_TIMEOUT = 10.0
DEFAULT_OUTBOX_MAX = 1024
MEMBER_FRESH = 60.0  # seconds a member name's node id is used without asking GET /v1/node again
NODE_ANSWER_MAX = 4 << 20  # the most of an answer of GET /v1/node the client reads
_REASON_MAX = 4096  # the most of any other answer it reads: its first line is the reason

# Every PAIR node id is a UUID (spec 3.4.1): what GET /v1/node must name.
_NODE_ID = re.compile(r"\A[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\Z")

LEASE_MIN, LEASE_MAX = 5, 86400

_log = logging.getLogger("wlmclient")

# The workload's fields the client sets itself; extra fields folding to one
# of them (or to "resync") are refused, as the daemon would refuse them.
_KNOWN_FIELDS = ("id", "runId", "seq", "model", "engine", "state", "createdAt", "startedAt",
                 "completedAt", "error", "requesterId", "scheduledOn", "originatedFrom", "resync")


class WlmError(Exception):
    """Every error this module raises."""


class ClosedError(WlmError):
    """The client is closed and takes no more frames."""


class QueueFullError(WlmError):
    """The queue is full: the frame was dropped and the job is unchanged."""


class JobEndedError(WlmError):
    """The job already had its terminal frame or its removal."""


class OwnedError(WlmError):
    """The node's broker owns this workload (409): the job's frames stop."""


class StatusError(WlmError):
    """The daemon answered a frame with a status that is final (a 3xx, which is
    never followed, or a 4xx other than 408 and 429) or was the last try."""

    def __init__(self, method, status, reason):
        super().__init__("wlmclient: %s: %d %s" % (method, status, reason))
        self.method, self.status, self.reason = method, status, reason


@dataclass
class Stats:
    """The client's counters (Go: wlmclient.Stats)."""
    queued: int = 0          # frames waiting or in flight now
    sent: int = 0            # frames the daemon answered 200
    retried: int = 0         # tries after a retryable failure
    refused: int = 0         # frames refused for good (4xx other than 408/429, or a 3xx)
    dropped: int = 0         # frames never sent: queue full, attempts spent, job owned, close's deadline
    outbox_pending: int = 0  # terminal frames in the outbox now
    outbox_full: int = 0     # terminal frames not kept because the outbox was full
    outbox_torn: int = 0     # outbox lines unreadable at start, skipped


def new_id(prefix="wlmclient"):
    """Mint a job id: prefix, host, process id, the time in milliseconds (base
    36) and 64 random bits, each part clipped to keep the id within the
    daemon's 256 bytes. The pid is read now, so a forked child mints its own."""
    host = "".join(c if (c.isascii() and c.isalnum()) or c in "-." else "_" for c in socket.gethostname())
    ms, digits = int(time.time() * 1000), ""
    while True:
        ms, r = divmod(ms, 36)
        digits = "0123456789abcdefghijklmnopqrstuvwxyz"[r] + digits
        if ms == 0:
            break
    return "%s-%s-%d-%s-%s" % (prefix[:64], host[:64], os.getpid(), digits, secrets.token_hex(8))


def _now_ms():
    return int(time.time() * 1000)


def _method_for(state):
    """The only place a method is chosen: from the state, so a frame's method
    always carries its state."""
    return {"queued": "workload:submitted", "running": "workload:started",
            "completed": "workload:completed"}.get(state, "workload:errored")


def _retryable(status):
    """A 5xx, a 408 (the body came too slowly) or a 429 may succeed when sent
    again; every other 4xx means the producer must change, and a 3xx that
    something other than the daemon answers on its address."""
    return status >= 500 or status in (408, 429)


def parse_retry_after(value, now=None):
    """Seconds to wait from a Retry-After of delay-seconds or an HTTP date; 0
    when absent or unreadable."""
    if not value:
        return 0.0
    value = value.strip()
    if value.isdigit():
        return float(min(int(value), 1 << 20))
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return 0.0
    if when is None:
        return 0.0
    return max(when.timestamp() - (time.time() if now is None else now), 0.0)


class _Frame:
    __slots__ = ("method", "body", "lease", "terminal", "outbox_key", "attempt", "delay")

    def __init__(self, method, body, lease=0, terminal=False, outbox_key=None):
        self.method, self.body, self.lease = method, body, lease
        self.terminal, self.outbox_key = terminal, outbox_key
        # The tries so far and the next backoff; only the sender thread
        # touches them, while the frame is its job's first.
        self.attempt, self.delay = 0, None


class _Outbox:
    """Terminal frames not yet taken by the daemon, one JSON object a line.
    Every change rewrites the file whole to a synced temporary file renamed
    over it (then the directory synced), so a crash leaves the old or the
    new file. At most ``max_entries`` entries."""

    def __init__(self, path, max_entries):
        self.path, self.max = path, max_entries
        # lock guards entries and torn and serializes the file's writes.
        # Last in the lock order: a Job's lock, the Client's lock, this.
        self.lock = threading.Lock()
        self.entries = {}  # key -> entry, in insertion order
        self.torn = 0
        self.closed = False
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            data = b""
        for line in data.split(b"\n"):
            if not line.strip():
                continue
            try:
                e = json.loads(line)
                if not (isinstance(e, dict) and all(isinstance(e.get(k), str) for k in ("key", "id", "method", "body"))):
                    raise ValueError("not an outbox entry")
            except ValueError:
                self.torn += 1
                continue
            if len(self.entries) < self.max:
                self.entries[e["key"]] = e
        if self.torn:
            _log.warning("wlmclient: outbox %s: %d unreadable line(s) skipped", path, self.torn)
            self._write()

    def replay(self):
        with self.lock:
            return list(self.entries.values())

    def add(self, entry):
        """Keep entry durably; False when the outbox is full."""
        with self.lock:
            if self.closed:
                return False
            if len(self.entries) >= self.max:
                return False
            self.entries[entry["key"]] = entry
            self._write()
            return True

    def remove(self, key):
        with self.lock:
            if self.closed or self.entries.pop(key, None) is None:
                return
            self._write()

    def pending(self):
        with self.lock:
            return len(self.entries)

    def close(self):
        with self.lock:
            self.closed = True

    def _write(self):
        d = os.path.dirname(os.path.abspath(self.path))
        fd, tmp = tempfile.mkstemp(prefix=".wlmclient-outbox-", dir=d)
        try:
            with os.fdopen(fd, "wb") as f:
                for e in self.entries.values():
                    f.write(json.dumps(e, separators=(",", ":")).encode() + b"\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        if hasattr(os, "O_DIRECTORY"):
            dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)


class Job:
    """One submitted job. Its methods queue the job's next frame and return at
    once; the frames are sent in the order they were asked for, one at a
    time, each with the next seq. Safe to use from many threads: a job's
    frames are in the order its method calls took its lock."""

    def __init__(self, client, job_id, info, ended=False):
        self._c = client
        self._id = job_id
        # _lock guards every field below. Lock order: this, then the
        # Client's lock, then the outbox's. Held across the outbox's file
        # write of the terminal frame (durable before it can be sent), never
        # across a request.
        self._lock = threading.Lock()
        self._info = info
        self._method = None
        self._seq = 0
        self._ended = ended
        self._pending = deque()  # frames waiting, the first possibly in flight or parked
        self._busy = False       # in the sender's ready queue, being sent or parked for a retry
        self._owned = False
        self._err = None
        self._renew_due = None   # monotonic time of the next lease renewal

    @property
    def id(self):
        return self._id

    @property
    def err(self):
        """Why the job's latest failed frame was not taken (a StatusError or a
        transport error), or None."""
        with self._lock:
            return self._err

    def start(self):
        """Queue the started frame (state running, startedAt now)."""
        self._next("running", lambda i: i.__setitem__("startedAt", _now_ms()))

    def complete(self):
        """Queue the completed frame, the job's last."""
        self._next("completed", lambda i: i.__setitem__("completedAt", _now_ms()))

    def fail(self, reason):
        """Queue the errored frame with state failed and reason, the job's last."""
        self._next("failed", lambda i: i.update(completedAt=_now_ms(), error=reason))

    def cancel(self, reason):
        """Queue the errored frame with state cancelled, the job's last."""
        self._next("cancelled", lambda i: i.update(completedAt=_now_ms(), error=reason))

    def remove(self):
        """Queue the job's removal (workloads:remove), its last frame."""
        self._next(None, None)

    def _next(self, state, apply):
        c = self._c
        terminal = state not in ("queued", "running")
        with self._lock:
            if self._ended:
                raise JobEndedError("wlmclient: job %s already ended" % self._id)
            if self._owned:
                raise OwnedError("wlmclient: the node's broker owns %s (409)" % self._id)
            # Built on a copy: a frame that is not queued leaves the job as
            # it was, its seq free again.
            seq = self._seq + 1
            info = dict(self._info)
            if state is None:
                method, params = "workloads:remove", {"workloadId": self._id}
            else:
                if apply is not None:
                    apply(info)
                info["seq"], info["state"] = seq, state
                method, params = _method_for(state), {"workloadInfo": info}
            body = json.dumps({"jsonrpc": "2.0", "method": method, "params": params},
                              separators=(",", ":")).encode()
            f = _Frame(method, body, terminal=terminal)
            if not terminal and c._lease:
                f.lease = c._lease
            c._reserve()
            # seq and the frame's place in the job's FIFO are taken under
            # one lock, so calls from many threads give a rising seq in
            # send order.
            if terminal and c._outbox is not None:
                key = "%s\x00%d" % (self._id, seq)
                try:
                    if c._outbox.add({"key": key, "id": self._id, "method": method, "body": body.decode()}):
                        f.outbox_key = key
                    else:
                        c._count("outbox_full")
                except OSError as e:
                    _log.warning("wlmclient: outbox: %s", e)
            self._seq, self._info, self._method, self._ended = seq, info, method, terminal
            self._pending.append(f)
            wake = not self._busy
            self._busy = True
            self._renew_due = None if terminal or not f.lease else time.monotonic() + c._renew_every
            due = self._renew_due
        c._wake(self if wake else None, due, self)


class Client:
    """A client of one node's ingress, with one sender thread.

    Use it as a context manager, or call :meth:`close` when done."""

    def __init__(self, addr=DEFAULT_ADDR, producer="wlmclient", lease=DEFAULT_LEASE,
                 queue_size=DEFAULT_QUEUE_SIZE, max_attempts=0,
                 backoff_min=DEFAULT_BACKOFF_MIN, backoff_max=DEFAULT_BACKOFF_MAX,
                 retry_after_max=DEFAULT_RETRY_AFTER_MAX, request_timeout=DEFAULT_REQUEST_TIMEOUT,
                 outbox_path=None, outbox_max=DEFAULT_OUTBOX_MAX):
        if lease is not None and lease > 0:
            if int(lease) != lease or not LEASE_MIN <= lease <= LEASE_MAX:
                raise ValueError("wlmclient: lease %r: must be whole seconds from %d to %d, or None for none"
                                 % (lease, LEASE_MIN, LEASE_MAX))
            lease = int(lease)
        else:
            lease = 0
        if queue_size <= 0 or outbox_max <= 0:
            raise ValueError("wlmclient: queue_size and outbox_max must be positive")
        self._url = "http://" + addr
        self._producer = producer or "wlmclient"
        self._lease = lease
        self._renew_every = lease / 3.0
        self._queue_size = queue_size
        self._max_attempts = max_attempts
        self._backoff_min = backoff_min
        self._backoff_max = max(backoff_max, backoff_min)
        self._retry_after_max = retry_after_max
        self._request_timeout = request_timeout
        host, _, port = addr.rpartition(":")
        self._host, self._port = host.strip("[]"), int(port)
        # The connection of the request in flight, if any, so close can cut
        # it off at its deadline; guarded by self._lock.
        self._inflight = None
        # _lock guards everything below it; _cond is signalled when a job is
        # ready, a renewal is armed, a frame left the queue or the client
        # stops. Lock order: a Job's lock, then this, then the outbox's.
        # Never held across a request or a file write.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._ready = deque()   # jobs with frames to send, each at most once
        self._renewals = []     # heap of (due, n, job); stale entries skipped
        self._renewal_n = 0     # the tie-breaker of both heaps, so a job is never compared
        # Jobs whose first frame waits for its retry: a heap of (due, n,
        # job), each job at most once and then in neither _ready nor in
        # flight. The job stays busy, so its later frames wait behind the
        # parked one and its renewals are held.
        self._parked = []
        # The client-wide hold after a transport error (no HTTP answer: the
        # daemon is down or hung): nothing is sent before _gate_until
        # (monotonic); _gate_delay is the next hold, doubling from
        # backoff_min to backoff_max, back to backoff_min at any answer.
        self._gate_until = 0.0
        self._gate_delay = backoff_min
        self._closed = False
        self._stopping = threading.Event()  # close's deadline passed
        self._queued = 0
        # What GET /v1/node last said of the members' names (member_id);
        # guarded by self._lock.
        self._members, self._members_at = {}, 0.0
        self._counts = {"sent": 0, "retried": 0, "refused": 0, "dropped": 0, "outbox_full": 0}
        # _park_for turns a retry's wait (seconds) into the time the job is
        # parked; a test records the waits and shortens them.
        self._park_for = lambda d: d
        self._outbox = None
        replay = []
        if outbox_path:
            self._outbox = _Outbox(outbox_path, outbox_max)
            replay = self._outbox.replay()
        # A replayed frame is queued beyond queue_size: the outbox is
        # bounded itself, and what it holds must not be dropped.
        for e in replay:
            j = Job(self, e["id"], {}, ended=True)
            j._pending.append(_Frame(e["method"], e["body"].encode(), terminal=True, outbox_key=e["key"]))
            j._busy = True
            self._queued += 1
            self._ready.append(j)
        self._thread = threading.Thread(target=self._run, name="wlmclient-sender", daemon=True)
        self._thread.start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if not self._closed:
            self.close(timeout=self._request_timeout)

    # --- submitting -------------------------------------------------------

    def submit(self, model, engine, id=None, run_id=None, requester_id=None,
               scheduled_on=None, scheduled_on_member=None, extra=None):
        """Queue the job's submitted frame (state queued) and return its handle.

        Leave ``id`` unset: the client mints one no other process can mint.
        ``scheduled_on_member`` names a member by its name; it is resolved
        with GET /v1/node, and an unknown name is an error."""
        if not model or not engine:
            raise WlmError("wlmclient: submit needs model and engine")
        for k in extra or {}:
            for known in _KNOWN_FIELDS:
                if k.casefold() == known.casefold():
                    raise WlmError("wlmclient: extra field %r is the workload's own field %r" % (k, known))
        if scheduled_on_member:
            if scheduled_on:
                raise WlmError("wlmclient: set scheduled_on or scheduled_on_member, not both")
            scheduled_on = self.member_id(scheduled_on_member)
        job_id = id or new_id(self._producer)
        info = dict(extra or {})
        info.update(id=job_id, runId=run_id or job_id, model=model, engine=engine, createdAt=_now_ms(),
                    startedAt=None, completedAt=None, error=None,
                    requesterId=requester_id or self._producer)
        if scheduled_on:
            info["scheduledOn"] = scheduled_on
        j = Job(self, job_id, info)
        j._next("queued", None)
        return j

    def node(self):
        """GET /v1/node: this node's id, members and limits, as a dict.

        The answer is taken only when it is this node's document: a 200 of
        application/json, at most NODE_ANSWER_MAX bytes, a JSON object
        naming a node id (a UUID), with a members list and a limits object.
        Anything else (a redirect, a page, ``{}``) raises WlmError: an id
        taken from it would report in the name of nobody."""
        try:
            status, headers, body = self._exchange("GET", "/v1/node", None, {}, NODE_ANSWER_MAX + 1)
        except (OSError, http.client.HTTPException) as e:
            raise WlmError("wlmclient: GET /v1/node: %s" % e) from e
        if 300 <= status < 400:
            raise StatusError("GET /v1/node", status, _redirect_reason(headers))
        if status != 200:
            raise StatusError("GET /v1/node", status, _first_line(body[:_REASON_MAX]))
        n = _node_document(headers, body)
        self._learn_members(n)
        return n

    def _learn_members(self, n):
        """Keep the member names of an answer of GET /v1/node. An answer that
        lists none (a daemon before its first discovery snapshot) teaches
        nothing and leaves what was learned; of two members of one name, the
        first listed is kept, as a search of the answer would find it."""
        ids = {}
        for m in n.get("members") or []:
            if isinstance(m, dict) and isinstance(m.get("nodeId"), str):
                ids.setdefault(m.get("name"), m["nodeId"])
        if not ids:
            return
        with self._lock:
            self._members, self._members_at = ids, time.monotonic()

    def member_id(self, name):
        """The node id of the member named name, for scheduledOn.

        A member's node id is its identity and does not change, so the answer
        is kept: a name learned within MEMBER_FRESH seconds is answered without
        asking again, and an older one is asked for again but, when the node
        cannot answer (its daemon restarting) or answers with no members at
        all (a restarted daemon before its first discovery snapshot), still
        answered from what was learned. A name never learned is always asked
        for. Without this a submit naming a member would fail whenever the
        daemon is away, where every other submit just waits in the queue for
        it."""
        with self._lock:
            known, age = self._members.get(name), time.monotonic() - self._members_at
        if known is not None and age < MEMBER_FRESH:
            return known
        try:
            self.node()
        except WlmError:
            if known is not None:
                return known
            raise
        with self._lock:
            known = self._members.get(name)
        if known is not None:
            return known
        raise WlmError("wlmclient: the node lists no member named %r" % name)

    def stats(self):
        with self._lock:
            s = Stats(queued=self._queued, **self._counts)
        if self._outbox is not None:
            s.outbox_pending, s.outbox_torn = self._outbox.pending(), self._outbox.torn
        return s

    def close(self, timeout=None):
        """Take no more frames, stop renewing leases and wait until every
        queued frame is delivered or refused, at most ``timeout`` seconds
        (None: no bound). At the deadline what is left is abandoned (terminal
        frames stay in the outbox) and WlmError says how many. Jobs left open
        keep their leases at the daemon, which retires them when they run out."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            if self._closed:
                raise ClosedError("wlmclient: client closed")
            self._closed = True
            self._renewals = []
            self._cond.notify_all()
            while self._queued > 0:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._cond.wait(left)
            unsent = self._queued
        # At the deadline the sender stops: a retry wait ends now, and a
        # request in flight is cut off, so the sender thread ends at once
        # rather than at the request's own deadline.
        self._stopping.set()
        with self._cond:
            self._cond.notify_all()
            inflight = self._inflight
        if inflight is not None:
            inflight.cut()
        if unsent == 0:
            self._thread.join()
        if self._outbox is not None:
            self._outbox.close()
        if unsent:
            with self._lock:
                self._counts["dropped"] += unsent
            raise WlmError("wlmclient: close: %d frame(s) not sent" % unsent)

    # --- the queue --------------------------------------------------------

    def _count(self, name, n=1):
        with self._lock:
            self._counts[name] += n

    def _reserve(self):
        """Take a place in the queue for one frame, or refuse it. The caller
        holds the frame's Job's lock, which comes before the Client's."""
        with self._lock:
            if self._closed:
                raise ClosedError("wlmclient: client closed")
            if self._queued >= self._queue_size:
                self._counts["dropped"] += 1
                raise QueueFullError("wlmclient: queue full, frame dropped")
            self._queued += 1

    def _wake(self, ready, due, job):
        with self._cond:
            if ready is not None:
                self._ready.append(ready)
            if due is not None and not self._closed:
                self._renewal_n += 1
                heapq.heappush(self._renewals, (due, self._renewal_n, job))
            self._cond.notify_all()

    def _run(self):
        """The sender: one frame at a time, jobs taken round-robin, so a
        job's frames leave in order and never two at once. A frame to be
        retried parks its job until its due time and the sender goes on
        with the other jobs; a transport error holds them all (the gate)."""
        while True:
            with self._cond:
                job = None
                while job is None:
                    if self._stopping.is_set():
                        return
                    self._renew_due_jobs()
                    now = time.monotonic()
                    while self._parked and self._parked[0][0] <= now:
                        self._ready.append(heapq.heappop(self._parked)[2])
                    wait = None
                    if self._ready:
                        if now >= self._gate_until:
                            job = self._ready.popleft()
                            break
                        wait = self._gate_until - now
                    for heap in (self._renewals, self._parked):
                        if heap:
                            w = max(heap[0][0] - now, 0)
                            wait = w if wait is None else min(wait, w)
                    self._cond.wait(wait)
            with job._lock:
                f = job._pending[0]
                owned = job._owned
            if owned:
                self._count("dropped")
                self._forget(f)
            elif not self._try(job, f):
                continue  # parked: its place in the queue and its busy mark kept
            if self._stopping.is_set():
                return
            with job._lock:
                job._pending.popleft()
                more = bool(job._pending)
                job._busy = more
            with self._cond:
                self._queued -= 1
                if more:
                    self._ready.append(job)
                self._cond.notify_all()

    def _renew_due_jobs(self):
        """Queue a renewal for every job whose time came: its last frame again,
        same seq, when none of its frames is waiting (a waiting frame carries
        the lease itself). self._lock is held, so job locks are taken with a
        non-blocking try (the lock order is Job then Client) and a busy job is
        retried at the next wake-up."""
        now = time.monotonic()
        while self._renewals and self._renewals[0][0] <= now:
            due, _, job = heapq.heappop(self._renewals)
            if not job._lock.acquire(blocking=False):
                self._renewal_n += 1
                heapq.heappush(self._renewals, (now + 0.05, self._renewal_n, job))
                return
            try:
                if job._renew_due != due or job._ended or job._owned:
                    continue
                job._renew_due = now + self._renew_every
                self._renewal_n += 1
                heapq.heappush(self._renewals, (job._renew_due, self._renewal_n, job))
                if job._pending:
                    continue
                if self._queued >= self._queue_size:
                    self._counts["dropped"] += 1
                    _log.warning("wlmclient: lease renewal of %s not queued: queue full", job._id)
                    continue
                body = json.dumps({"jsonrpc": "2.0", "method": job._method,
                                   "params": {"workloadInfo": job._info}}, separators=(",", ":")).encode()
                job._pending.append(_Frame(job._method, body, lease=self._lease))
                self._queued += 1
                if not job._busy:
                    job._busy = True
                    self._ready.append(job)
            finally:
                job._lock.release()

    def _forget(self, f):
        if self._outbox is not None and f.outbox_key:
            try:
                self._outbox.remove(f.outbox_key)
            except OSError as e:
                _log.warning("wlmclient: outbox: %s", e)

    def _try(self, job, f):
        """Send f once. True when f is done with: the daemon took it, refused
        it for good, or its attempts are spent. False when f is to be tried
        again: its job is parked until then, still busy, f still first."""
        if f.attempt:
            self._count("retried")
        f.attempt += 1
        status, reason, retry_after, err = self._post(f)
        if err is None:
            with self._lock:
                self._gate_delay = self._backoff_min  # the daemon answers
        if err is None and status == 200:
            self._count("sent")
            self._forget(f)
            return True
        if err is None and not _retryable(status):
            self._count("refused")
            serr = StatusError(f.method, status, reason)
            with job._lock:
                job._err = serr
                if status == 409:
                    job._owned = True
            _log.warning("wlmclient: frame refused, not retried: method=%s id=%s status=%d reason=%s",
                         f.method, job._id, status, reason[:256])
            self._forget(f)
            return True
        problem = err if err is not None else StatusError(f.method, status, reason)
        spent = bool(self._max_attempts and f.attempt >= self._max_attempts)
        with self._cond:
            if err is not None:
                # No answer at all: the daemon is down or hung, for every
                # job alike. The whole client holds for a shared backoff, and
                # this job is due when the hold ends: one try per backoff
                # while the daemon is away, not one per job. The hold is
                # taken even when this frame's attempts are spent, or each
                # frame's last try would let the next one out at once.
                d = self._gate_delay
                self._gate_delay = min(2 * d, self._backoff_max)
                wait = self._park_for(d - random.uniform(0, d / 2))
                due = time.monotonic() + wait
                self._gate_until = max(self._gate_until, due)
            elif not spent:
                # The daemon refused this frame for now: only this job
                # waits. A 503 at --max-live-workloads refuses new jobs
                # while the frames of admitted ones must still pass to end
                # their runs and free the slots.
                d = self._backoff_min if f.delay is None else f.delay
                f.delay = min(2 * d, self._backoff_max)
                wait = d - random.uniform(0, d / 2)
                if retry_after > 0:
                    # Never earlier than the daemon asked, plus up to a
                    # quarter more so producers it turned away do not
                    # return together.
                    ra = min(retry_after, self._retry_after_max)
                    wait = ra + random.uniform(0, ra / 4)
                due = time.monotonic() + self._park_for(wait)
            if not spent:
                self._renewal_n += 1
                heapq.heappush(self._parked, (due, self._renewal_n, job))
            self._cond.notify_all()
        if spent:
            self._count("dropped")
            with job._lock:
                job._err = problem
            _log.warning("wlmclient: giving up on a frame: method=%s id=%s attempts=%d err=%s",
                         f.method, job._id, f.attempt, problem)
            return True  # a terminal frame stays in the outbox for the next start
        return False

    def _post(self, f):
        """Send f once: (status, first line of the answer, Retry-After seconds,
        transport error). A 3xx is an answer like any other: its reason names
        where it pointed, and nothing is sent there."""
        headers = {"Content-Type": "application/json"}
        if f.lease:
            headers["Workload-Lease"] = str(f.lease)
        try:
            status, h, body = self._exchange("POST", "/v1/workloads/events", f.body, headers, _REASON_MAX)
        except (OSError, http.client.HTTPException) as e:
            return 0, "", 0.0, e
        if 300 <= status < 400:
            return status, _redirect_reason(h), 0.0, None
        if status == 200:
            return status, "", 0.0, None
        return status, _first_line(body), parse_retry_after(h.get("Retry-After")), None

    def _exchange(self, method, path, body, headers, limit):
        """One request to the node, within one deadline (request_timeout from
        now) for all of it: (status, headers, at most limit bytes of the
        body). A body that does not arrive whole by the deadline is returned
        as far as it came when the status is 200 (the frame was taken: the
        status is the answer), and raised otherwise. Never a redirect: this
        speaks HTTP itself, to the node's address only."""
        conn = _DeadlineConnection(self._host, self._port, time.monotonic() + self._request_timeout)
        with self._lock:
            self._inflight = conn
        resp = None
        try:
            conn.putrequest(method, path, skip_accept_encoding=True)
            for k, v in headers.items():
                conn.putheader(k, v)
            conn.putheader("User-Agent", "wlmclient-python")
            conn.putheader("Connection", "close")
            if body is not None:
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            resp = conn.getresponse()
            try:
                data = resp.read(limit)
            except (OSError, http.client.HTTPException):
                if resp.status != 200 or method == "GET":
                    raise
                data = b""
            return resp.status, resp.headers, data
        finally:
            with self._lock:
                if self._inflight is conn:
                    self._inflight = None
            if resp is not None:
                resp.close()
            conn.close()


class _DeadlineReader(io.RawIOBase):
    """A socket's reading side whose every read ends by one deadline, for
    http.client's response: a socket timeout alone bounds each read, so a
    server sending a byte a second would hold a request for as long as it
    likes."""

    def __init__(self, owner, deadline):
        super().__init__()
        self._owner, self._deadline = owner, deadline

    def readable(self):
        return True

    def readinto(self, b):
        sock = self._owner.sock
        sock.settimeout(_left(self._deadline))
        return sock.recv_into(b)

    def close(self):
        if not self.closed:
            self._owner.release()
        super().close()


class _DeadlineSocket:
    """What http.client sees as its socket: the real one, each send and read
    bounded by the request's deadline. As with a socket's own makefile, the
    real socket is closed once the connection and every reader are: http.client
    closes the connection while its response still reads."""

    def __init__(self, sock, deadline):
        self.sock, self._deadline = sock, deadline
        self._readers, self._closed = 0, False

    def sendall(self, data):
        self.sock.settimeout(_left(self._deadline))
        self.sock.sendall(data)

    def makefile(self, mode, *args, **kwargs):
        self._readers += 1
        return io.BufferedReader(_DeadlineReader(self, self._deadline))

    def release(self):
        self._readers -= 1
        if self._closed and self._readers == 0:
            self.sock.close()

    def close(self):
        self._closed = True
        if self._readers == 0:
            self.sock.close()


class _DeadlineConnection(http.client.HTTPConnection):
    """An HTTP connection whose connect, request and answer share one
    deadline (a time.monotonic() value). http.client follows no redirect
    and uses no proxy from the environment, which a loopback daemon must
    never be reached through."""

    def __init__(self, host, port, deadline):
        super().__init__(host, port, timeout=max(deadline - time.monotonic(), 0.001))
        self._deadline = deadline
        self._raw = None
        self._cut = False

    def connect(self):
        sock = socket.create_connection((self.host, self.port), timeout=_left(self._deadline))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._raw = sock
        self.sock = _DeadlineSocket(sock, self._deadline)
        if self._cut:
            self.cut()

    def cut(self):
        """End the request now, from another thread (close's deadline): its
        reads and sends fail at once."""
        self._cut = True
        sock = self._raw
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _left(deadline):
    """The time to a request's deadline, or socket.timeout when it passed."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise socket.timeout("wlmclient: the request's deadline passed")
    return left


def _redirect_reason(headers):
    """The reason of a 3xx, which the client never follows: where it pointed."""
    loc = (headers.get("Location") or "")[:256]
    return ("a redirect to %r, not followed: the client sends only to its node's ingress "
            "(is something other than the daemon listening there?)" % loc)


def _node_document(headers, body):
    """The answer of GET /v1/node as a dict, or WlmError unless it is the
    node's document: JSON by its type, an object with a node id, a members
    list and a limits object, within NODE_ANSWER_MAX bytes."""
    ctype = headers.get("Content-Type") or ""
    if not ctype or headers.get_content_type() != "application/json":
        raise WlmError("wlmclient: GET /v1/node: the answer is %r, not application/json: "
                       "not the daemon's node document" % ctype[:128])
    if len(body) > NODE_ANSWER_MAX:
        raise WlmError("wlmclient: GET /v1/node: the answer is over %d bytes: not the daemon's node document"
                       % NODE_ANSWER_MAX)
    try:
        n = json.loads(body)
    except ValueError as e:
        raise WlmError("wlmclient: GET /v1/node: not JSON: %s" % e) from e
    if not isinstance(n, dict):
        raise WlmError("wlmclient: GET /v1/node: not a JSON object: not the daemon's node document")
    if not (isinstance(n.get("nodeId"), str) and _NODE_ID.match(n["nodeId"])):
        raise WlmError("wlmclient: GET /v1/node: the answer names no node id (a UUID in nodeId): "
                       "not the daemon's node document")
    if not isinstance(n.get("members"), list):
        raise WlmError("wlmclient: GET /v1/node: the answer has no members list: not the daemon's node document")
    if not isinstance(n.get("limits"), dict):
        raise WlmError("wlmclient: GET /v1/node: the answer has no limits object: not the daemon's node document")
    return n


def _first_line(b):
    return b.decode("utf-8", "replace").strip().split("\n", 1)[0]
