"""What the soak (bench/soak.py) reads from Redis to judge the fleet: every event as it is written, how each
job ended, and, with retention caps, the keyspace and memory each time the queue is empty.

Retention removes finished jobs (jobpool/retention.py), so the end of a soak can no longer read every job's
row or every event: the pool's stream is capped (JOBPOOL_EVENTS_MAXLEN) and a pruned job has no row. So:

- `EventLog` follows the stream live, in a thread, and keeps every event. A read that finds the stream's
  oldest entry past the last one it had read may have missed some: it is counted (`unseen`) and breaks the
  zeros, since the transition check would be blind there. A Redis rollback holds the follower (`hold`) from
  before the AOF is copied until Redis is back from the copy, so it never keeps an event Redis took back.
- `endings` judges each job by its row and its last event: a row that is gone after the job's last event
  was terminal was pruned (fine); gone before that, the job was lost.
- `Keyspace` takes a census at each moment the queue is empty (every job ended, pruning caught up): the
  keys by kind and Redis's memory. See `Keyspace.judge` for what "flat" means.
"""

from __future__ import annotations

import contextlib
import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import redis

from bench.soak_fleet import stream_id
from jobpool import Pool
from jobpool.store.keys import PoolKeys

TERMINAL = ("succeeded", "failed", "cancelled")
#: Entries per read of the stream.
PAGE = 2000
#: An adoption request's RQ job id names the job it adopts (jobpool/supervisor/adoption.py).
ADOPT_RQ_ID = re.compile(r"jobpool-adopt-([0-9A-Za-z]+)-[0-9]+-[0-9a-f]+")


class EventLog(threading.Thread):
    """Every event of the pool's stream, read live (every 0.1 s) with its own connection."""

    def __init__(self, url: str, keys: PoolKeys, client: redis.Redis | None = None) -> None:
        """Reads through a connection of its own to `url`, or through `client` (a text client) when given."""
        super().__init__(daemon=True)
        self.client = client or redis.Redis.from_url(url, decode_responses=True, socket_timeout=5)
        self.key = keys.events
        self.events: list[dict[str, str]] = []
        #: The state each job's last event left it in, and that event's reason (a failure's error_reason).
        self.last: dict[str, str] = {}
        self.reason: dict[str, str] = {}
        #: Rows removed by retention, per state, from the prune scripts' events.
        self.pruned: Counter[str] = Counter()
        #: Jobs that left a terminal state again (a retry), per state left: once that state was pruned to its
        #: cap, each such leaving is a row the cap no longer holds (`Keyspace.fewest_rows`).
        self.reopened: Counter[str] = Counter()
        self.unseen = 0
        #: The jobs a schedule fired (their rows name the schedule and tick: scripts/enqueue.lua), in the
        #: order they were enqueued; the jobs enqueued whose rows were gone before they could be read; and
        #: those still to read (every enqueued job's row is read once, just after its enqueue is).
        self.fired: dict[str, tuple[str, str]] = {}
        self.unread: set[str] = set()
        self._to_read: list[str] = []
        self.row_key = keys.job
        self.cursor: str | None = None
        self._lock = threading.Lock()
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            self.read()
            self._halt.wait(0.1)

    def read(self) -> None:
        """Everything written since the last read (nothing while Redis does not answer)."""
        with self._lock, contextlib.suppress(redis.RedisError):
            while self._page() == PAGE:
                pass
            self._read_rows()

    def _read_rows(self) -> None:
        """The schedule and tick of each job enqueued since the last read, from its row: read live, before
        retention may prune the row. A read Redis does not answer is made again next time."""
        if not self._to_read:
            return
        pipe = self.client.pipeline(transaction=False)
        for job in self._to_read:
            pipe.hmget(self.row_key(job), "state", "schedule", "tick")
        for job, (state, schedule, tick) in zip(self._to_read, pipe.execute(), strict=True):
            if state is None:
                self.unread.add(job)
            elif schedule:
                self.fired[job] = (schedule, tick or "")
        self._to_read = []

    def _page(self) -> int:
        pipe = self.client.pipeline(transaction=True)
        pipe.xrange(self.key, "-" if self.cursor is None else f"({self.cursor}", "+", count=PAGE)
        pipe.xrange(self.key, "-", "+", count=1)
        batch, oldest = pipe.execute()
        if self.cursor is not None and oldest and stream_id(oldest[0][0]) > stream_id(self.cursor):
            self.unseen += 1
            print(f"soak: the event stream was trimmed past {self.cursor} (its oldest is {oldest[0][0]}): "
                  "events may have gone unseen", file=sys.stderr)
        for entry_id, fields in batch:
            event = {"id": entry_id, **fields}
            self.events.append(event)
            if event.get("job") and event.get("reason") == "enqueued" and not event.get("from"):
                self._to_read.append(event["job"])
            if event.get("job") and (event.get("from") or event.get("to")):  # not a note of both empty
                before = self.last.get(event["job"], "")
                if before in TERMINAL and event.get("to", "") not in TERMINAL:
                    self.reopened[before] += 1
                self.last[event["job"]] = event.get("to", "")
                self.reason[event["job"]] = event.get("reason", "")
            elif event.get("reason") == "pruned":
                state, _, n = event.get("evidence", "").partition(" ")
                self.pruned[state] += int(n or 0)
            self.cursor = entry_id
        return len(batch)

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """No reads meanwhile: what is written while held may be taken back (a Redis rollback)."""
        with self._lock:
            yield

    def ended(self) -> Counter[str]:
        """Jobs whose last event is terminal, per state."""
        return Counter(s for s in self.last.values() if s in TERMINAL)

    def stop(self) -> None:
        self._halt.set()
        self.join(10)
        self.read()
        self.client.close()


@dataclass
class Endings:
    outcomes: Counter[str] = field(default_factory=Counter)
    failure_reasons: Counter[str] = field(default_factory=Counter)
    lost: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    #: Jobs whose row is gone after their last event was terminal, per that state.
    pruned: Counter[str] = field(default_factory=Counter)


def endings(pool: Pool, log: EventLog, job_ids: list[str]) -> Endings:
    """Each job by its row, or, once its row is gone, by its last event (read after the rows: a row is
    pruned only well after its job's last event)."""
    out = Endings()
    pipe = pool.store.client.pipeline(transaction=False)
    for job_id in job_ids:
        pipe.hmget(pool.keys.job(job_id), "state", "error_reason")
    rows = pipe.execute()
    log.read()
    for job_id, (state, reason) in zip(job_ids, rows, strict=True):
        if state is None:
            last = log.last.get(job_id, "")
            if last in TERMINAL:
                out.pruned[last] += 1
                out.outcomes[last] += 1
                if last == "failed":
                    out.failure_reasons[log.reason.get(job_id, "")] += 1
            else:
                out.lost.append(job_id)
                print(f"soak: lost {job_id}: its row is gone, its last event left it {last or 'nowhere'}",
                      file=sys.stderr)
            continue
        out.outcomes[state] += 1
        if state == "failed":
            out.failure_reasons[reason or ""] += 1
        if state not in TERMINAL:
            out.stuck.append(job_id)
            print(f"soak: stuck {job_id} in {state}", file=sys.stderr)
    return out


@dataclass
class Census:
    """The keyspace at one moment the queue was empty."""

    at: float
    #: Jobs ended so far (last event terminal), per state; and how many rows the caps keep of them.
    ended: dict[str, int]
    expected_rows: int
    #: The fewest rows the caps may hold: fewer than `expected_rows` once a job left a state already pruned
    #: to its cap (a retry of a failed job): the cap keeps the newest N, and a pruned row does not come back.
    fewest_rows: int
    keys: int
    rows: int
    #: Keys without a TTL that belong to a job with a row (RQ's record of a delivery its horse did not end).
    kept: int
    #: Keys without a TTL that belong to a job with no row: what a pruned job left behind.
    orphans: list[str]
    #: Keys without a TTL that belong to no job: the pool's and RQ's own (`shared`); `unexpected`: any other.
    other: list[str]
    unexpected: list[str]
    #: Keys that expire by themselves, by kind (leases, boot records, RQ's worker records, answered adoption
    #: requests), what they hold, and the longest time one has left.
    volatile: Counter[str]
    volatile_bytes: int
    max_ttl_secs: float
    #: Redis's used_memory, and the parts of it that move with connections and restarts, not with jobs: the
    #: clients' buffers (mem_clients_normal) and the script cache (used_memory_scripts).
    used_memory: int
    clients_memory: int
    scripts_memory: int
    #: What the keys without a TTL hold (MEMORY USAGE, exact).
    persistent_bytes: int
    stream_len: int
    #: Seconds since redis-server (re)started: the first seconds after a restart, its memory is still
    #: growing back as the fleet reconnects and loads its scripts again.
    redis_uptime: int
    settled: bool = True

    @property
    def rows_right(self) -> bool:
        """The rows are what the caps keep: no fewer, none over."""
        return self.fewest_rows <= self.rows <= self.expected_rows

    @property
    def persistent(self) -> int:
        return self.keys - sum(self.volatile.values())

    @property
    def net_memory(self) -> int:
        """used_memory less client buffers, the script cache and keys with a TTL: what jobs could grow."""
        return self.used_memory - self.clients_memory - self.scripts_memory - self.volatile_bytes

    def same(self, other: Census) -> bool:
        return (self.keys, self.rows, self.kept, self.orphans, self.other) == (
            other.keys, other.rows, other.kept, other.orphans, other.other)

    def line(self) -> str:
        ended = ",".join(f"{s}:{self.ended.get(s, 0)}" for s in TERMINAL)
        at = time.strftime("%H:%M:%S", time.localtime(self.at))
        ttl = ",".join(f"{k}:{n}" for k, n in sorted(self.volatile.items()))
        return (f"census {at} ended=[{ended}] keys={self.keys} persistent={self.persistent} "
                f"rows={self.rows}/{self.fewest_rows}-{self.expected_rows} kept={self.kept} "
                f"orphans={len(self.orphans)} "
                f"other={len(self.other)} unexpected={self.unexpected} with_ttl=[{ttl}] "
                f"max_ttl={self.max_ttl_secs:.0f}s used_memory={self.used_memory} "
                f"clients={self.clients_memory} scripts={self.scripts_memory} "
                f"with_ttl_bytes={self.volatile_bytes} net={self.net_memory} "
                f"persistent_bytes={self.persistent_bytes} stream={self.stream_len} up={self.redis_uptime}s"
                f"{'' if self.settled else ' (unsettled)'}")


def owner(key: str, prefix: str) -> str | None:
    """The job a per-job key belongs to (None for the pool's and RQ's shared keys)."""
    for start in (prefix + "job:", prefix + "lease:", prefix + "adopt:", "rq:job:", "rq:results:"):
        if key.startswith(start):
            rest = key[len(start):]
            m = ADOPT_RQ_ID.fullmatch(rest)
            return m.group(1) if m else rest
    return None


def kind(key: str) -> str:
    """A key's name with its ids left out: what kind of key it is."""
    return re.sub(r"[0-9a-f]{12,}", "*", re.sub(r"jobpool-adopt-[^:]*", "jobpool-adopt-*", key))


def shared(key: str, keys: PoolKeys) -> bool:
    """One of the keys with a fixed name: the pool's own (jobpool/store/keys.py `PoolKeys`), RQ's for the
    pool's queue and for each daemon's own queue (its list, registries, workers) and RQ's global ones. A fixed
    set (one per daemon at most): they cannot grow with jobs."""
    fixed = {v for v in vars(keys).values() if isinstance(v, str) and v.startswith(keys.prefix)}
    queue = keys.rq_queue_name
    # The queues only one daemon's workers listen on (store/keys.py `daemon_queue_name`): one per daemon.
    daemon_queue = re.fullmatch(rf"rq:\w+:{re.escape(queue)}\.d-[0-9a-f]{{16}}(:intermediate)?", key)
    return (key in fixed or key in ("rq:queues", "rq:workers") or key == keys.rq_intermediate
            or (key.startswith("rq:") and key.endswith(":" + queue) and key.count(":") == 2)
            or daemon_queue is not None)


class Keyspace:
    """Censuses of the keyspace at each moment the queue is empty, and the judgement of them."""

    def __init__(self, caps: dict[str, int], events_maxlen: int, memory_tolerance: float = 0.10,
                 warm_secs: int = 5) -> None:
        self.caps, self.events_maxlen = caps, events_maxlen
        self.memory_tolerance, self.warm_secs = memory_tolerance, warm_secs
        self.censuses: list[Census] = []

    def expected_rows(self, ended: Counter[str]) -> int:
        return sum(min(ended[s], self.caps[s]) if self.caps[s] else ended[s] for s in TERMINAL)

    def fewest_rows(self, ended: Counter[str], log: EventLog) -> int:
        """`expected_rows` less, in each state already pruned, the jobs that left it since (at most)."""
        return sum(max(0, (min(ended[s], self.caps[s]) if self.caps[s] else ended[s])
                          - (log.reopened[s] if self.caps[s] and log.pruned[s] else 0)) for s in TERMINAL)

    def take(self, pool: Pool, log: EventLog, timeout: float = 20.0) -> Census:
        """A census once the keyspace has settled: the rows are what the caps keep (the supervisors prune
        every sweep) and two readings 0.3 s apart agree (a horse deletes RQ's record of its delivery just
        after the row ended). Taken anyway at the deadline, marked unsettled."""
        deadline = time.monotonic() + timeout
        prev: Census | None = None
        while True:
            log.read()
            census = self._read(pool, log)
            if prev is not None and census.same(prev) and census.rows_right:
                break
            if time.monotonic() > deadline:
                census.settled = False
                print(f"soak: the keyspace did not settle: {census.line()}", file=sys.stderr)
                break
            prev = census
            time.sleep(0.3)
        self.censuses.append(census)
        return census

    def _read(self, pool: Pool, log: EventLog) -> Census:
        c, prefix = pool.store.client, pool.keys.prefix
        names = sorted(set(c.scan_iter(count=1000)))
        pipe = c.pipeline(transaction=False)
        for name in names:
            pipe.pttl(name)
            pipe.memory_usage(name, samples=0)
        replies = pipe.execute()
        ttl = dict(zip(names, replies[0::2], strict=True))
        size = {n: int(b or 0) for n, b in zip(names, replies[1::2], strict=True)}
        persistent = [n for n in names if ttl[n] == -1]
        volatile = [n for n in names if ttl[n] != -1]
        rows = {owner(n, prefix) for n in persistent if n.startswith(prefix + "job:")}
        owned = [(n, owner(n, prefix)) for n in persistent]
        other = [n for n, o in owned if o is None]
        ended = log.ended()
        memory = c.info("memory")
        return Census(
            at=time.time(), ended=dict(ended), expected_rows=self.expected_rows(ended),
            fewest_rows=self.fewest_rows(ended, log), keys=len(names),
            rows=len(rows), kept=sum(1 for _, o in owned if o in rows) - len(rows),
            orphans=[n for n, o in owned if o is not None and o not in rows],
            other=other, unexpected=[n for n in other if not shared(n, pool.keys)],
            volatile=Counter(kind(n) for n in volatile), volatile_bytes=sum(size[n] for n in volatile),
            max_ttl_secs=max((ttl[n] / 1000 for n in volatile), default=0.0),
            used_memory=int(memory["used_memory"]), clients_memory=int(memory["mem_clients_normal"]),
            scripts_memory=int(memory["used_memory_scripts"]),
            persistent_bytes=sum(size[n] for n in persistent), stream_len=int(c.xlen(pool.keys.events)),
            redis_uptime=int(c.info("server")["uptime_in_seconds"]))

    def at_caps(self) -> list[Census]:
        """The censuses taken once the caps were reached: the succeeded cap (most jobs succeed) and the
        event stream's cap. The failed and cancelled caps fill more slowly; their rows are counted exactly
        (`expected_rows`) whether or not they are full."""
        return [c for c in self.censuses
                if c.ended.get("succeeded", 0) >= self.caps["succeeded"]
                and c.stream_len >= self.events_maxlen]

    def judge(self) -> dict[str, Any]:
        """Flat, once the caps are reached, means at every census (taken with the queue empty, so no key of
        a live job is counted):

        - keys: the job rows are exactly what the caps keep (the newest N of each state): nothing lost,
          nothing left over; the keys kept with them (RQ's record and result of a delivery whose horse was
          killed) are at most two per row; no key of a job whose row is gone (orphans); every other key
          without a TTL has a fixed name (`shared`). So the keys without a TTL are bounded by the caps,
          whatever the number of jobs. Keys with a TTL are counted (by kind, with the longest TTL left),
          not judged: they go by themselves, with time, not with jobs.
        - memory: `Census.net_memory` (used_memory less client buffers, the script cache and keys with a
          TTL, which move with connections and restarts) of the later half of the censuses stays within
          `memory_tolerance` (10%) of its highest in the earlier half. Only censuses taken `warm_secs` (5 s)
          or more after redis-server started count: in its first seconds a restarted Redis is some 300 KB
          lower and grows back as the fleet reconnects, whatever the jobs. The highest of each half, so one
          census low for any other reason does not decide. What moves it with nothing wrong: rows of
          different sizes and the stream between its cap and its cap plus a node (100 entries), a few KB.
          What it catches: anything that grows by KBs per job (RQ's records of ended jobs cost 7.8 KB per
          job before they were removed: +20% over the later half of a 200-job soak); a row's worth per job
          (~1.4 KB) is within the noise of so short a run, and is what the key checks catch exactly."""
        cs = self.at_caps()
        if not cs:
            return {"censuses": 0, "keys_flat": False, "memory_flat": False}
        jobs = sum(cs[-1].ended.values()) - sum(cs[0].ended.values())
        warm = [c for c in cs if c.redis_uptime >= self.warm_secs]
        net = [c.net_memory for c in warm]
        with_ttl = [sum(c.volatile.values()) for c in cs]
        half = len(warm) // 2
        growth = (max(net[half:]) - max(net[:half])) / max(net[:half]) if half else float("inf")
        # Per job: from the middle of the earlier half to the middle of the later one.
        ended = [sum(c.ended.values()) for c in warm]
        between = ended[half + (len(warm) - half) // 2] - ended[half // 2] if half else 0
        per_job = (max(net[half:]) - max(net[:half])) / between if between else 0.0
        verdict: dict[str, Any] = {
            "censuses": len(cs), "unsettled": sum(not c.settled for c in cs), "jobs_after_caps": jobs,
            "keys": (min(c.keys for c in cs), max(c.keys for c in cs)),
            "persistent": (min(c.persistent for c in cs), max(c.persistent for c in cs)),
            "rows": (min(c.rows for c in cs), max(c.rows for c in cs)),
            "rows_off": sum(not c.rows_right for c in cs),
            "orphans": sorted({n for c in cs for n in c.orphans}),
            "unexpected": sorted({n for c in cs for n in c.unexpected}),
            "kept_over": sum(c.kept > 2 * c.rows for c in cs),
            "with_ttl": (min(with_ttl), max(with_ttl)),
            "max_ttl_secs": max(c.max_ttl_secs for c in cs),
            "used_memory": (min(c.used_memory for c in cs), max(c.used_memory for c in cs)),
            "net_memory": (min(net), max(net)) if net else (0, 0), "net_growth": growth,
            "net_per_job": per_job, "warm": len(warm),
        }
        verdict["keys_flat"] = not (verdict["rows_off"] or verdict["orphans"] or verdict["unexpected"]
                                    or verdict["kept_over"])
        verdict["memory_flat"] = growth <= self.memory_tolerance
        return verdict


def keyspace_line(verdict: dict[str, Any]) -> str:
    if not verdict.get("censuses"):
        return "keyspace_at_caps=[caps never reached]"

    def span(pair: tuple[int, int], unit: int = 1, suffix: str = "") -> str:
        return f"{pair[0] / unit:.0f}..{pair[1] / unit:.0f}{suffix}"

    return (f"keyspace_at_caps=[censuses={verdict['censuses']} jobs={verdict['jobs_after_caps']} "
            f"keys={span(verdict['keys'])} without_ttl={span(verdict['persistent'])} "
            f"rows={span(verdict['rows'])} rows_off_caps={verdict['rows_off']} "
            f"orphans={len(verdict['orphans'])} unexpected_keys={len(verdict['unexpected'])} "
            f"with_ttl={span(verdict['with_ttl'])} (max {verdict['max_ttl_secs']:.0f}s left) "
            f"used_memory={span(verdict['used_memory'], 1024, 'KB')} "
            f"net={span(verdict['net_memory'], 1024, 'KB')} over {verdict['warm']} "
            f"(later half {100 * verdict['net_growth']:+.1f}%, "
            f"{verdict['net_per_job']:+.0f}B/job) "
            f"keys_flat={verdict['keys_flat']} memory_flat={verdict['memory_flat']}]")
