"""Lifetime: a pool that runs for months keeps Redis bounded (retention), and what a retained job costs.

    python3 -m bench.lifetime [--quick]

Each part starts its own private redis-server (tests/support/servers.py) and compares against a baseline from
the same run:

1. row cost: bytes per retained finished job, measured as (used_memory with N retained rows - used_memory
   once they are pruned) / N (less the clients' buffers and what the event stream changed by), next to
   `MEMORY USAGE` of one row, what each field adds to it, and the same row stored otherwise (without its
   redundant fields, as one string, as a listpack); for an empty log and a typical 4 KB text log (as
   `Attempt.finish` stores it, and packed by jobpool/logtail.py). Goal: <= 2 KB with an empty log.
2. lifetime: >= 200,000 jobs through the real scripts (`Pool.enqueue` -> promote -> `Attempt.claim` ->
   `set_container` -> `finish`, no containers; half succeed, 3 in 10 fail, 2 in 10 are cancelled while they
   run) with the default caps, pruning as the supervisor does (`retention.prune` with the sweep's budget,
   every `PRUNE_EVERY` jobs); `used_memory` against jobs run. It must go flat once the caps are reached: the
   growth over the last half is printed as a ratio, next to what the first jobs' growth projects without
   retention. The bench does what RQ's worker does with a delivered job that ended (deletes `rq:job:<id>`:
   result TTL 0, jobpool/rqjob.py `after_delivery`); part 4 checks that RQ really leaves nothing.
3. sweep and prune: `Supervisor.sweep` over 1,000 running rows (subprocess executor: 800 with their
   owner's lease, 200 orphans whose recorded process is alive) with no finished rows, with 100,000 retained
   finished rows, and with none again; a twin pool on a second redis-server, never given finished rows, is
   swept in turn each time (median of several sweeps each; goal: within 10%). Then one sweep meeting a
   backlog of 90,000 rows past the default cap, and `retention.prune` of the rest to the end (rows/s).
4. real workers: >= 2,000 jobs through `python -m jobpool.workers` (JOBPOOL_EXECUTOR=subprocess) and a
   supervisor process (6 in 10 succeed, 3 fail, 1 is cancelled while queued): the keys and bytes per
   retained job, against the same mix through the scripts alone on the same server.

`--quick` runs smaller sizes (and caps of 1,000 and a stream of 10,000 events in part 2, so they are reached).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

from jobpool import Pool, logtail, retention
from jobpool.config import Settings
from jobpool.procid import identity_of, kernel_boot_id
from jobpool.store import redispolicy
from jobpool.store.calls import Store
from jobpool.supervisor import ContainerProber, Supervisor
from jobpool.workers.attempt import Attempt
from tests.support.procs import JobpoolProcess
from tests.support.servers import RedisServer, redis_server_binary

IMAGE = "jobpool-test:busybox"
PRUNE_EVERY = 1000
ENDED = ("succeeded", "failed", "cancelled")
MiB = 1024 * 1024


def _term_to_exit(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def redis_server() -> Iterator[RedisServer]:
    rs = RedisServer()
    try:
        rs.start()
        yield rs
    finally:
        rs.close()


def used(pool: Pool) -> int:
    return int(pool.store.client.info("memory")["used_memory"])


def used_data(pool: Pool) -> int:
    """used_memory less the clients' buffers: a prune's arguments (a thousand keys) stay in its client's query
    buffer until Redis trims it, which would be counted against the rows."""
    info = pool.store.client.info("memory")
    return int(info["used_memory"]) - int(info.get("mem_clients_normal", 0))


def mu(pool: Pool, key: str) -> int:
    return int(pool.store.client.memory_usage(key, samples=0) or 0)


def bytes_per_pruned_job(pool: Pool) -> tuple[float, int]:
    """Prune every finished job of `pool` but the newest of each state; (used_memory freed per job, less what
    the event stream changed by, and how many went)."""
    # Load the prune script first (a run with no ids): loading it mid-measure would be charged to the rows.
    pool.store.prune("succeeded", 1, 0, "bench", ids=[], job_keys=[])
    ev0, m1 = mu(pool, pool.keys.events), used_data(pool)
    report = retention.prune(with_caps(pool, **{f"keep_{s}": 1 for s in ENDED}).store, actor="bench")
    ev1, m0 = mu(pool, pool.keys.events), used_data(pool)
    return (m1 - m0 - (ev0 - ev1)) / report.total, report.total


def runs_text(runs: list[float]) -> str:
    return ", ".join(f"{r:.0f}" for r in runs)


def with_caps(pool: Pool, **caps: Any) -> Pool:
    """The same pool (same client) under other retention caps."""
    return Pool(pool.store.client, dataclasses.replace(pool.settings, **caps), actor="bench")


class Shapes:
    """What a worker records for its job, without running anything: a docker worker's container id and daemon
    identity, or the subprocess executor's process identity."""

    def __init__(self) -> None:
        self.daemon_id = f"jpd1:{uuid.uuid4()}@{kernel_boot_id()}"
        self.identity = {"executor": "subprocess", **identity_of(os.getpid())}

    def start(self, pool: Pool, job_id: str, boot: str, shape: str) -> Attempt:
        att = Attempt(pool.store, job_id, boot, 1)
        if shape == "docker":
            att.claim("docker", self.daemon_id)
            att.set_container(uuid.uuid4().hex + uuid.uuid4().hex, self.daemon_id)
        else:
            att.claim("subprocess", "")
            att.set_container("", "", self.identity)
        return att


def run_job(pool: Pool, shapes: Shapes, boot: str, shape: str, ending: str, log: bytes | str = b"") -> str:
    """One job through the real scripts, promoted into a free slot by its enqueue; RQ's record goes as RQ's
    worker deletes it for a delivered job that ended."""
    job = pool.enqueue(IMAGE, ["sh", "-c", "run-step"])
    att = shapes.start(pool, job.id, boot, shape)
    if ending == "cancelled":
        pool.cancel(job.id)
        assert att.heartbeat().cancel
        state = att.finish("interrupted", 143, log_tail=log)
    else:
        state = att.finish("exit", 0 if ending == "succeeded" else 1, log_tail=log)
    assert state == ending, (state, ending)
    pool.store.client.delete(pool.keys.rq_job(job.id))
    return job.id


def text_log(seed: int, size: int = 4096) -> bytes:
    """A typical job's text output: timestamped progress lines with changing numbers."""
    rnd = random.Random(seed)
    lines, total, step = [], 0, rnd.randrange(1000)
    while total < size:
        step += 1
        stamp = f"12:{rnd.randrange(60):02d}:{rnd.randrange(60):02d}.{rnd.randrange(1000):03d}"
        line = (f"2026-11-30T{stamp}Z INFO train step {step}/5000 loss={rnd.uniform(0.1, 2):.4f} "
                f"lr={rnd.uniform(1e-5, 1e-3):.2e} throughput={rnd.uniform(100, 900):.1f} samples/s\n")
        lines.append(line)
        total += len(line)
    return "".join(lines).encode()[-size:]


# ---- 1. row cost ------------------------------------------------------------------------------------------

def retained_cost(pool: Pool, n: int, shape: str, log: Any = None) -> dict[str, Any]:
    """Bytes per retained succeeded row: run `n` jobs, then prune all but one; used_memory difference (less
    what the event stream changed by) over the rows removed."""
    shapes, boot = Shapes(), uuid.uuid4().hex
    pool.set_slots(1)
    ids = [run_job(pool, shapes, boot, shape, "succeeded", log(i) if log else b"") for i in range(n)]
    sample, index = ids[-1], pool.keys.state_index("succeeded")
    row_mu = mu(pool, pool.keys.job(sample))
    encoding = pool.store.client.object("encoding", pool.keys.job(sample))
    stored = cast("str | None", pool.store.client.hget(pool.keys.job(sample), "log_tail")) or ""
    index_per = mu(pool, index) / pool.store.client.zcard(index)
    per_row, removed = bytes_per_pruned_job(pool)
    assert removed == n - 1, removed
    pool.store.client.delete(pool.keys.job(sample), index)
    return {"per_row": per_row, "mu": row_mu, "encoding": encoding,
            "stored_log": len(stored.encode()), "packed": stored.startswith(logtail.MARK),
            "index_per": index_per, "sample": sample}


#: Fields a finished row usually keeps with nothing to say: `finished_as` (the answer to a finish sent again,
#: scripts/finish.lua) equals the row's state when that finish ended the job, and `recovery_attempts` "0" is
#: what a missing field reads as (models.py).
REDUNDANT = ("finished_as", "recovery_attempts")


def field_costs(pool: Pool, key: str) -> tuple[list[tuple[str, int, int]], dict[str, int]]:
    """(field, value bytes, MEMORY USAGE it adds) for every field of the row at `key`, most costly first; and
    the MEMORY USAGE of the row as stored and of copies stored otherwise (what-ifs, never written by jobpool).

    A field's cost is measured on copies holding one spare empty field, so that taking one field away never
    halves the hash table's bucket array (which would charge that field for 8 B of every bucket)."""
    row = cast("dict[str, str]", pool.store.client.hgetall(key))
    tmp = key + ":bench-copy"

    def cost(mapping: dict[str, str] | None = None, text: str | None = None) -> int:
        if text is not None:
            pool.store.client.set(tmp, text)
        else:
            pool.store.client.hset(tmp, mapping=cast("dict[Any, Any]", mapping))
        try:
            return mu(pool, tmp)
        finally:
            pool.store.client.delete(tmp)

    padded = {**row, "~": ""}
    full_padded = cost(padded)
    out = [(name, len(value.encode()), full_padded - cost({k: v for k, v in padded.items() if k != name}))
           for name, value in row.items()]
    lean = {k: v for k, v in row.items() if k not in REDUNDANT}
    whatif = {"as stored": mu(pool, key), f"without {' and '.join(REDUNDANT)}": cost(lean),
              "as one string (the row as JSON)": cost(text=json.dumps(row, separators=(",", ":")))}
    old = cast(str, pool.store.client.config_get("hash-max-listpack-value")["hash-max-listpack-value"])
    pool.store.client.config_set("hash-max-listpack-value", 1 << 20)
    try:
        pool.store.client.hset(tmp, mapping=cast("dict[Any, Any]", row))
        assert pool.store.client.object("encoding", tmp) == "listpack"
        whatif["as a listpack (hash-max-listpack-value >= its longest value)"] = mu(pool, tmp)
    finally:
        pool.store.client.delete(tmp)
        pool.store.client.config_set("hash-max-listpack-value", old)
    return sorted(out, key=lambda f: -f[2]), whatif


def part_row_cost(n: int) -> dict[str, Any]:
    print(f"\n-- 1. bytes per retained finished job ({n} succeeded rows through the real scripts, then "
          f"pruned)", flush=True)
    results: dict[str, Any] = {}
    with redis_server() as rs:
        pool = Pool.from_url(rs.url, "rowcost", max_concurrent_jobs=1)
        # Keep one row of the docker shape to take apart field by field.
        keep = Pool.from_url(rs.url, "rowkeep", max_concurrent_jobs=1)
        keep.set_slots(1)
        kept = run_job(keep, Shapes(), uuid.uuid4().hex, "docker", "succeeded")
        logs = [text_log(i) for i in range(16)]
        # Warm-up: the first rows a fresh server stores also grow its key table and allocator arenas.
        retained_cost(pool, n, "docker")
        cases = [("docker, empty log", "docker", None), ("subprocess, empty log", "subprocess", None),
                 ("docker, 4 KB text log as Attempt.finish stores it", "docker", lambda i: logs[i % 16])]
        for name, shape, log in cases:
            results[name] = r = retained_cost(pool, n, shape, log)
            print(f"  {name:52s} {r['per_row']:7.0f} B/row (used_memory); MEMORY USAGE of one row "
                  f"{r['mu']:5d} B ({r['encoding']}); index entry {r['index_per']:.0f} B; log stored "
                  f"{r['stored_log']} B{' packed' if r['packed'] else ''}", flush=True)
        # The same rows on a Redis configured as `jobpool up` and docker-compose.yml run it (a row stays a
        # listpack); rows written before the change stay hash tables, so only new rows are measured.
        setting, value = redispolicy.ROW_LISTPACK_SETTING, redispolicy.ROW_LISTPACK_VALUE
        default_value = cast(str, pool.store.client.config_get(setting)[setting])
        pool.store.client.config_set(setting, value)
        try:
            for case, shape, log in cases[0:1] + cases[2:3]:
                name = f"{case}, {setting} {value} (as `jobpool up` runs Redis)"
                results[name] = r = retained_cost(pool, n, shape, log)
                print(f"  {name:52s} {r['per_row']:7.0f} B/row (used_memory); MEMORY USAGE of one row "
                      f"{r['mu']:5d} B ({r['encoding']}); index entry {r['index_per']:.0f} B", flush=True)
        finally:
            pool.store.client.config_set(setting, default_value)
        if not results[cases[2][0]]["packed"]:
            name = "docker, 4 KB text log packed by logtail.encode"
            results[name] = r = retained_cost(pool, n, "docker",
                                              lambda i: logtail.encode(logs[i % 16]))
            print(f"  {name:52s} {r['per_row']:7.0f} B/row (used_memory); MEMORY USAGE of one row "
                  f"{r['mu']:5d} B ({r['encoding']}); log stored {r['stored_log']} B "
                  f"(Attempt.finish stores the tail as given: packed here before the call)", flush=True)
        fields, whatif = field_costs(keep, keep.keys.job(kept))
        row = cast("dict[str, str]", keep.store.client.hgetall(keep.keys.job(kept)))
        full = whatif["as stored"]
        encoding = keep.store.client.object("encoding", keep.keys.job(kept))
        limit = keep.store.client.config_get("hash-max-listpack-value")["hash-max-listpack-value"]
        print(f"  one docker-shaped succeeded row, empty log: {len(row)} fields, {sum(map(len, row))} B of "
              f"names + {sum(len(v.encode()) for v in row.values())} B of values + "
              f"{len(keep.keys.job(kept))} B key; longest value {max(len(v) for v in row.values())} B, so a "
              f"{encoding} (a listpack only while every value is <= {limit} B)")
        print(f"  what each field adds to MEMORY USAGE, B (its value's bytes); the other "
              f"{full - sum(f[2] for f in fields)} B are the key, the object and the bucket array:")
        print("    " + ", ".join(f"{f} {saved} ({size})" for f, size, saved in fields))
        print("  MEMORY USAGE of that row " + "; ".join(f"{k}: {v} B" for k, v in whatif.items()))
        results["fields"], results["whatif"] = fields, whatif
    return results


# ---- 2. lifetime ------------------------------------------------------------------------------------------

ENDINGS = ["succeeded"] * 5 + ["failed"] * 3 + ["cancelled"] * 2
#: The keys a job may leave (store/keys.py `leftovers`), by kind as `key_kinds` names them.
PER_JOB_KINDS = ("jobpool:job", "jobpool:lease", "jobpool:adopt", "rq:job", "rq:results")


def part_lifetime(n: int, sample_every: int, caps: dict[str, int]) -> dict[str, Any]:
    cap_text = (", ".join(f"{k}={v}" for k, v in caps.items()) if caps
                else "default caps (10,000 per state, stream 100,000 events)")
    print(f"\n-- 2. lifetime: {n:,} jobs through the real scripts, {cap_text}; retention.prune(budget "
          f"{retention.SWEEP_BUDGET_SECS}s) every {PRUNE_EVERY} jobs", flush=True)
    with redis_server() as rs:
        pool = Pool.from_url(rs.url, "life", max_concurrent_jobs=1, **caps)
        pool.set_slots(1)
        shapes = Shapes()
        boots = [uuid.uuid4().hex for _ in range(4)]
        base = used(pool)
        samples: list[tuple[int, int, int]] = [(0, base, pool.store.client.dbsize())]
        pruned_calls: list[tuple[float, int, bool]] = []
        print(f"  {'jobs':>8s} {'used_memory':>12s} {'keys':>7s} {'succeeded':>9s} {'failed':>7s} "
              f"{'cancelled':>9s} {'events':>7s} {'stream':>9s} {'jobs/s':>7s} {'pruned':>7s} "
              f"{'prune ms max':>12s}")
        t_int, pruned_int, prune_max = time.perf_counter(), 0, 0.0
        t_all = time.perf_counter()
        for i in range(1, n + 1):
            run_job(pool, shapes, boots[i % 4], "docker", ENDINGS[i % 10])
            if i % PRUNE_EVERY == 0:
                t = time.perf_counter()
                rep = retention.prune(pool.store, budget_secs=retention.SWEEP_BUDGET_SECS, actor="bench")
                ms = (time.perf_counter() - t) * 1000
                pruned_calls.append((ms, rep.total, rep.complete))
                pruned_int += rep.total
                prune_max = max(prune_max, ms)
            if i % sample_every == 0:
                now = time.perf_counter()
                m, keys = used(pool), pool.store.client.dbsize()
                kept = [pool.store.client.zcard(pool.keys.state_index(s)) for s in ENDED]
                samples.append((i, m, keys))
                print(f"  {i:8,d} {m / MiB:9.1f} MiB {keys:7d} {kept[0]:9d} {kept[1]:7d} {kept[2]:9d} "
                      f"{pool.store.client.xlen(pool.keys.events):7d} "
                      f"{mu(pool, pool.keys.events) / MiB:5.1f} MiB "
                      f"{sample_every / (now - t_int):7.0f} "
                      f"{pruned_int:7d} {prune_max:12.1f}", flush=True)
                t_int, pruned_int, prune_max = now, 0, 0.0
        wall = time.perf_counter() - t_all
        half = min(samples, key=lambda s: abs(s[0] - n // 2))
        last = samples[-1]
        growth = last[1] / half[1]
        first = samples[1]
        per_job_early = (first[1] - base) / first[0]
        projected = base + per_job_early * n
        incomplete = sum(1 for c in pruned_calls if not c[2])
        kept_total = sum(pool.store.client.zcard(pool.keys.state_index(s)) for s in ENDED)
        kinds = key_kinds(pool)
        per_job = sum(kinds[k] for k in PER_JOB_KINDS)
        fixed = last[2] - per_job
        print(f"  {n:,} jobs in {wall:.0f} s ({n / wall:.0f} jobs/s, prune included); prune calls "
              f"{len(pruned_calls)}, median {statistics.median(c[0] for c in pruned_calls):.1f} ms, max "
              f"{max(c[0] for c in pruned_calls):.1f} ms, {incomplete} stopped by the budget")
        print(f"  used_memory at {half[0]:,} jobs {half[1] / MiB:.1f} MiB, at {last[0]:,} jobs "
              f"{last[1] / MiB:.1f} MiB: growth over the last half {growth:.3f}x; keys {half[2]} -> "
              f"{last[2]} ({per_job} keys of {kept_total} retained jobs: "
              f"{({k: kinds[k] for k in PER_JOB_KINDS})}; {fixed} pool-wide keys)")
        print(f"  without retention (the first {first[0]:,} jobs' {per_job_early:.0f} B/job, projected): "
              f"{projected / MiB:.0f} MiB at {n:,} jobs, {projected / last[1]:.1f}x what is used")
    return {"growth": growth, "half": half, "last": last, "projected": projected, "wall": wall,
            "keys_per_job": per_job / kept_total}


# ---- 3. sweep and prune -----------------------------------------------------------------------------------

@dataclasses.dataclass
class Timing:
    """Sweeps of one supervisor: wall ms of each, and medians of its phases, of the time Redis spent executing
    its commands (INFO commandstats) and of this process's CPU."""

    runs: list[float] = dataclasses.field(default_factory=list)
    phases: list[dict[str, float]] = dataclasses.field(default_factory=list)
    redis_ms: list[float] = dataclasses.field(default_factory=list)
    cpu_ms: list[float] = dataclasses.field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.runs)

    def text(self) -> str:
        phases = {k: round(statistics.median(p[k] for p in self.phases), 1) for k in self.phases[0]}
        return (f"median {self.median:5.1f} ms (runs {runs_text(self.runs)}); Redis "
                f"{statistics.median(self.redis_ms):.1f} ms, this process's CPU "
                f"{statistics.median(self.cpu_ms):.1f} ms; phases {phases}")


def redis_busy_ms(store: Store) -> float:
    return sum(float(v.get("usec", 0)) for v in store.client.info("commandstats").values()) / 1000


def timed_sweeps(sups: list[Supervisor], repeat: int) -> list[Timing]:
    """Sweep each supervisor `repeat` times, taking turns (a change of load on the machine meets both)."""
    out = [Timing() for _ in sups]
    for r in range(repeat):
        order = list(enumerate(sups)) if r % 2 == 0 else list(enumerate(sups))[::-1]
        for i, sup in order:
            busy, cpu, t = redis_busy_ms(sup.store), time.process_time(), time.perf_counter()
            rep = sup.sweep()
            out[i].runs.append((time.perf_counter() - t) * 1000)
            out[i].cpu_ms.append((time.process_time() - cpu) * 1000)
            out[i].redis_ms.append(redis_busy_ms(sup.store) - busy)
            out[i].phases.append(rep.phases_ms or {})
    return out


def running_rows(pool: Pool, rows: int, orphans: int, identity: dict[str, Any]) -> None:
    """`rows` running rows claimed by a live boot (subprocess executor) recording the process `identity`;
    the first `orphans` lose their owner's lease (the process lives on: a warning each sweep, no write)."""
    pool.set_slots(rows + 1)
    ids = []
    for _ in range(rows):
        job = pool.enqueue(IMAGE, ["sleep", "3600"])
        att = Attempt(pool.store, job.id, "live-boot", 1)
        att.claim("subprocess", "")
        att.set_container("", "", identity)
        ids.append(job.id)
    pool.store.client.delete(*[pool.keys.lease(j) for j in ids[:orphans]])  # their owner died
    pool.store.client.delete(pool.keys.rq_queue)  # claimed: nothing left for RQ


def part_sweep_prune(rows: int, orphans: int, retained: int, cap: int, repeat: int) -> dict[str, Any]:
    print(f"\n-- 3. sweep with {retained:,} retained finished rows vs none ({rows} running rows, {orphans} "
          f"of them orphans whose process is alive; subprocess executor), median of {repeat}; a twin pool on "
          f"a second redis-server, never given finished rows, is swept in turn each time; prune throughput",
          flush=True)
    sleeper = subprocess.Popen(["sleep", "3600"])
    try:
        with redis_server() as rs, redis_server() as rs_twin:
            identity = {"executor": "subprocess", **identity_of(sleeper.pid)}
            pool, twin = (Pool.from_url(url, name, max_concurrent_jobs=rows + 1, executor="subprocess",
                                        lease_secs=3600, job_stale_seconds=86400, keep_succeeded=retained)
                          for url, name in ((rs.url, "sweep"), (rs_twin.url, "twin")))
            sups = []
            for p in (pool, twin):
                running_rows(p, rows, orphans, identity)
                sups.append(Supervisor(p.store, ContainerProber(None, timeout=5), actor="bench"))
                sups[-1].sweep()  # warm-up
            sup = sups[0]
            before, twin1 = timed_sweeps(sups, repeat)
            print(f"  no finished rows:      {before.text()}\n    twin {twin1.median:.1f} ms "
                  f"({before.median / twin1.median:.3f}x)", flush=True)
            t = time.perf_counter()
            shapes, boot = Shapes(), uuid.uuid4().hex
            for _ in range(retained):
                run_job(pool, shapes, boot, "docker", "succeeded")
            print(f"  seeded {retained:,} succeeded rows through the scripts in "
                  f"{time.perf_counter() - t:.0f} s; used_memory {used(pool) / MiB:.0f} MiB", flush=True)
            sup.sweep()
            loaded, twin2 = timed_sweeps(sups, repeat)
            paired = loaded.median / twin2.median
            print(f"  {retained:,} retained rows: {loaded.text()}\n    twin {twin2.median:.1f} ms "
                  f"({paired:.3f}x)", flush=True)
            # The same rows past the default cap: one sweep meets the backlog, then prune runs to the end.
            default = with_caps(pool, keep_succeeded=cap)
            backlog = retained - cap
            cap_name = "the default cap" if cap == Settings().keep_succeeded else f"a cap of {cap:,}"
            sup_default = Supervisor(default.store, ContainerProber(None, timeout=5), actor="bench")
            t = time.perf_counter()
            rep = sup_default.sweep()
            one = (time.perf_counter() - t) * 1000
            swept_rate = rep.pruned / (rep.phases_ms["prune"] / 1000) if rep.pruned else 0.0
            print(f"  one sweep meeting a backlog of {backlog:,} rows past {cap_name}: {one:.0f} ms; it "
                  f"pruned {rep.pruned:,} in its prune phase of {rep.phases_ms['prune']:.0f} ms "
                  f"({swept_rate:,.0f} rows/s; budget {retention.SWEEP_BUDGET_SECS * 1000:.0f} ms)",
                  flush=True)
            pool.store.client.config_resetstat()
            t = time.perf_counter()
            rest = retention.prune(default.store, actor="bench")
            secs = time.perf_counter() - t
            stats = pool.store.client.info("commandstats").get("cmdstat_evalsha", {})
            rate = rest.total / secs if rest.total else 0.0
            print(f"  retention.prune to the end: {rest.total:,} rows in {secs:.2f} s = {rate:,.0f} rows/s "
                  f"(batches of {retention.BATCH}; Redis busy {stats.get('usec_per_call', 0) / 1000:.1f} ms "
                  f"per batch script); left {pool.store.client.zcard(pool.keys.succeeded):,}", flush=True)
            if rest.total < 1000:  # the sweep took (almost) all of it: its own rate is the figure
                rate = swept_rate
            retention.prune(with_caps(pool, keep_succeeded=1).store, actor="bench")
            sup.sweep()
            after, twin3 = timed_sweeps(sups, repeat)
            print(f"  none again (pruned):   {after.text()}\n    twin {twin3.median:.1f} ms "
                  f"({after.median / twin3.median:.3f}x)")
            none = statistics.median(before.runs + after.runs)
            ratio = loaded.median / none
            with_rows = loaded.median
            unloaded_redis = statistics.median(before.redis_ms + after.redis_ms)
            redis_ratio = statistics.median(loaded.redis_ms) / unloaded_redis
            print(f"  sweep with {retained:,} retained / without: {paired:.3f}x against the twin swept in "
                  f"turn; {ratio:.3f}x against the same pool before and after (median of both, "
                  f"{none:.1f} ms; the machine's load moves this one); Redis time per sweep "
                  f"{redis_ratio:.3f}x")
            for s_ in (*sups, sup_default):
                s_.close()
    finally:
        sleeper.kill()
        sleeper.wait(10)
    return {"ratio": ratio, "paired": paired, "none": none, "with": with_rows, "rate": rate,
            "one_sweep_ms": one, "redis_ratio": redis_ratio}


# ---- 4. real workers --------------------------------------------------------------------------------------

def key_kinds(pool: Pool) -> Counter[str]:
    """Keys by kind: the pool's own by their first part after the hash tag, RQ's by their first two parts."""
    kinds: Counter[str] = Counter()
    for key in pool.store.client.scan_iter(count=1000):
        if key.startswith("jobpool:{"):
            kinds["jobpool:" + key.split("}:", 1)[1].split(":", 1)[0]] += 1
        else:
            kinds[":".join(key.split(":")[:2])] += 1
    return kinds


def wait_for(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"lifetime: {what} after {timeout:.0f} s")
        time.sleep(0.2)


def real_mix(i: int) -> str:
    """The ending of job `i` in part 4: 6 in 10 succeed, 3 fail, 1 is cancelled while it waits its turn."""
    return "failed" if i % 10 in (6, 7, 8) else "cancelled" if i % 10 == 9 else "succeeded"


def script_mix(pool: Pool, n: int) -> None:
    """Part 4's mix through the scripts alone, shaped as the subprocess executor writes its rows."""
    shapes, boot = Shapes(), uuid.uuid4().hex
    pool.set_slots(1)
    for i in range(n):
        if real_mix(i) == "cancelled":  # queued behind a full slot, cancelled there: never delivered
            pool.set_slots(0)
            pool.cancel(pool.enqueue(IMAGE, ["true"]).id)
            pool.set_slots(1)
        else:
            run_job(pool, shapes, boot, "subprocess", real_mix(i))


def keys_of_jobs(pool: Pool) -> tuple[int, Counter[str]]:
    """How many finished jobs `pool` retains, and the keys they hold, by kind (store/keys.py `leftovers`)."""
    ids = [j for state in ENDED
           for j in cast("list[str]", pool.store.client.zrange(pool.keys.state_index(state), 0, -1))]
    kinds = ("job", "rq:job", "rq:results", "lease", "adopt")
    pipe = pool.store.client.pipeline(transaction=False)
    for job_id in ids:
        for key in pool.keys.leftovers(job_id):
            pipe.exists(key)
    found = pipe.execute()
    out: Counter[str] = Counter()
    for i, hit in enumerate(found):
        out[kinds[i % len(kinds)]] += hit
    return len(ids), out


def per_state_mu(pool: Pool) -> dict[str, float]:
    out = {}
    for state in ENDED:
        some = cast("list[str]", pool.store.client.zrange(pool.keys.state_index(state), 0, 199))
        if some:
            out[state] = statistics.mean(mu(pool, pool.keys.job(j)) for j in some)
    return out


def part_real_workers(n: int, workers: int) -> dict[str, Any]:
    print(f"\n-- 4. real workers: {n:,} jobs through {workers} `python -m jobpool.workers` (subprocess "
          f"executor) and a supervisor process, default caps; then the same mix through the scripts",
          flush=True)
    root = Path(tempfile.mkdtemp(prefix="jp-lifetime-"))
    procs: list[JobpoolProcess] = []
    try:
        with redis_server() as rs:
            env = {"JOBPOOL_REDIS_URL": rs.url, "JOBPOOL_POOL": "real", "JOBPOOL_EXECUTOR": "subprocess",
                   "JOBPOOL_STATE_DIR": str(root / "state"), "JOBPOOL_SWEEP_INTERVAL_SECS": "2"}
            pool = Pool.from_env(env=env)
            pool.set_slots(workers)
            procs += [JobpoolProcess("jobpool.workers", env, root / f"worker-{i}.log")
                      for i in range(workers)]
            procs.append(JobpoolProcess("jobpool.cli", env, root / "supervisor.log", ("supervisor",)))
            rq_workers = f"rq:workers:{pool.keys.rq_queue_name}"
            wait_for(lambda: pool.store.client.zcard(pool.keys.boots) >= workers
                     and pool.store.client.scard(rq_workers) >= workers, 60, "workers did not register")
            before, keys0 = key_kinds(pool), pool.store.client.dbsize()
            t = time.perf_counter()
            ids, cancelled = [], set()
            for i in range(n):
                job = pool.enqueue(IMAGE, ["sh", "-c", "exit 3"] if real_mix(i) == "failed" else ["true"])
                if real_mix(i) == "cancelled":
                    with contextlib.suppress(Exception):  # it may have ended first
                        pool.cancel(job.id)
                        cancelled.add(job.id)
                ids.append(job.id)

            def states() -> list[str | None]:
                pipe = pool.store.client.pipeline(transaction=False)
                for job_id in ids:
                    pipe.hget(pool.keys.job(job_id), "state")
                return pipe.execute()

            wait_for(lambda: all(s in ENDED for s in states()), 60 + n / 5, "jobs did not end")
            wall = time.perf_counter() - t
            ended = Counter(states())

            def rq_ids() -> set[str]:
                return {k.split(":", 2)[2] for k in pool.store.client.scan_iter(match="rq:job:*", count=1000)}

            # RQ deletes its record of a delivered job as its work horse ends: wait for the last to go.
            wait_for(lambda: rq_ids() <= cancelled, 30, "RQ kept records of delivered jobs")
            after, keys1 = key_kinds(pool), pool.store.client.dbsize()
            grown = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
            left_rq = len(rq_ids())
            kept, real_keys = keys_of_jobs(pool)
            print(f"  {n:,} jobs ended in {wall:.0f} s ({n / wall:.1f} jobs/s): {dict(ended)}; keys "
                  f"{keys0} -> {keys1}, by kind {grown}")
            print(f"  RQ kept {left_rq} job hashes (of jobs cancelled while queued: never delivered, pruned "
                  f"with their rows), {after.get('rq:results', 0)} result streams, registries: finished "
                  f"{pool.store.client.zcard(pool.keys.rq_finished)}, failed "
                  f"{pool.store.client.zcard(pool.keys.rq_failed)}")
            real_mu = per_state_mu(pool)
            for proc in procs:
                proc.stop(timeout=20)
            procs.clear()
            real_per_job, _ = bytes_per_pruned_job(pool)
            # The same mix through the scripts alone, on the same server.
            script = Pool.from_url(rs.url, "script", max_concurrent_jobs=1, executor="subprocess")
            script_mix(script, n)
            script_kept, script_keys = keys_of_jobs(script)
            script_mu = per_state_mu(script)
            script_per_job, _ = bytes_per_pruned_job(script)
            print(f"  keys of the retained jobs: real workers {dict(real_keys)} for {kept:,} jobs "
                  f"({real_keys.total() / kept:.3f} per job); scripts {dict(script_keys)} for "
                  f"{script_kept:,} ({script_keys.total() / script_kept:.3f} per job)")
            print(f"  bytes per retained job (used_memory freed by pruning them): real workers "
                  f"{real_per_job:.0f} B, scripts {script_per_job:.0f} B "
                  f"({real_per_job / script_per_job:.2f}x)")
            print("  MEMORY USAGE per row, real / scripts: " + ", ".join(
                f"{s} {real_mu[s]:.0f} / {script_mu[s]:.0f} B" for s in real_mu if s in script_mu))
    finally:
        for proc in procs:
            proc.stop(timeout=20)
        if any("Traceback" in log.read_text(errors="replace") for log in root.glob("*.log")):
            print(f"  (a process logged a traceback: logs kept in {root})")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return {"per_job": real_per_job, "script_per_job": script_per_job,
            "keys_per_job": real_keys.total() / kept,
            "script_keys_per_job": script_keys.total() / script_kept,
            "left_rq": left_rq}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes (caps of 1,000 in the lifetime part)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)
    signal.signal(signal.SIGTERM, _term_to_exit)
    if args.quick:
        caps: dict[str, int] = {f"keep_{s}": 1000 for s in ENDED}
        sizes: dict[str, Any] = {
            "row": 500, "life": 20_000, "every": 2_000, "caps": {**caps, "events_maxlen": 10_000},
            "rows": 200, "orphans": 40, "retained": 10_000, "cap": 1_000, "repeat": 9, "real": 200}
    else:
        sizes = {"row": 2_000, "life": 200_000, "every": 10_000, "caps": {}, "rows": 1000, "orphans": 200,
                 "retained": 100_000, "cap": 10_000, "repeat": 15, "real": 2_000}
    t0 = time.perf_counter()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"lifetime{' --quick' if args.quick else ''}: redis-server {redis_version()}, load average "
          f"{load} on {os.cpu_count()} CPU(s)", flush=True)
    rows = part_row_cost(sizes["row"])
    life = part_lifetime(sizes["life"], sizes["every"], sizes["caps"])
    sweep = part_sweep_prune(sizes["rows"], sizes["orphans"], sizes["retained"], sizes["cap"],
                             sizes["repeat"])
    real = part_real_workers(sizes["real"], 3)
    empty = rows["docker, empty log"]["per_row"]
    print(f"\nsummary ({time.perf_counter() - t0:.0f} s):")
    print(f"  used_memory over the last half of {sizes['life']:,} jobs: {life['growth']:.3f}x "
          f"(goal flat, <= 1.05x): {'met' if life['growth'] <= 1.05 else 'NOT met'}")
    setting = f"{redispolicy.ROW_LISTPACK_SETTING} {redispolicy.ROW_LISTPACK_VALUE}"
    compact = rows[f"docker, empty log, {setting} (as `jobpool up` runs Redis)"]["per_row"]
    print(f"  bytes per retained finished job, empty log (goal <= 2048): {compact:.0f} B on a Redis run as "
          f"`jobpool up` runs it ({setting}): {'met' if compact <= 2048 else 'NOT met'}; {empty:.0f} B at "
          f"Redis's default: {'met' if empty <= 2048 else 'NOT met'}")
    print(f"  sweep with {sizes['retained']:,} retained rows / without: {sweep['paired']:.3f}x against a "
          f"twin pool swept in turn (goal <= 1.10): {'met' if sweep['paired'] <= 1.10 else 'NOT met'}; "
          f"{sweep['ratio']:.3f}x before/after, Redis time {sweep['redis_ratio']:.3f}x")
    print(f"  prune throughput {sweep['rate']:,.0f} rows/s; keys per retained job: lifetime scripts "
          f"{life['keys_per_job']:.2f}; real workers {real['keys_per_job']:.3f} vs scripts "
          f"{real['script_keys_per_job']:.3f} (RQ hashes kept only for jobs cancelled while queued: "
          f"{real['left_rq']}); bytes per retained job real / scripts "
          f"{real['per_job'] / real['script_per_job']:.2f}x")
    return 0


def redis_version() -> str:
    out = subprocess.run([redis_server_binary() or "redis-server", "--version"], capture_output=True,
                         text=True, check=False)
    return out.stdout.split()[2].removeprefix("v=") if out.returncode == 0 else "?"


if __name__ == "__main__":
    sys.exit(main())
