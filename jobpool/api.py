"""`Pool`: the public Python API over one pool's registry in Redis.

Every state change is one Lua script (see scripts/), called through the pool's store (jobpool/store/calls.py
`Store`, one typed method per script); this module validates the caller's input, says who acts, and turns
what the store returns into `Job` snapshots. Nothing here does check-then-act across round trips, and
nothing here touches Redis but through the store.

`Pool` is the facade for callers of the package, never a layer inside it: the supervisor, the workers and
the fleet take the store itself, and the CLI and the dashboard call these operations through
jobpool/operations.py `PoolOperations` (docs/architecture.md, "Components").
"""

from __future__ import annotations

import builtins
import datetime
import logging
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal, overload

import redis

from . import apichecks, errors, retention, schedules, submit, waiting
from . import events as event_stream
from .apichecks import MAX_LIST
from .browse import Browsing
from .config import Settings
from .contract import LIMIT_NAME_MAX_CHARS, MAX_LIMIT, MAX_SLOTS
from .livelogs import LiveText
from .models import TERMINAL, Job, JobState
from .retention import PruneReport
from .schedules import Schedule
from .spec import LIMIT_NAME
from .status import Health, StatusReport, read_status
from .store.calls import Store
from .store.orderreads import LimitUse
from .store.redisurl import connect
from .submit import BATCH_SIZE, MAX_BATCH_SIZE
from .trends import TrendPoint, read_trends

log = logging.getLogger("jobpool")

class Pool(Browsing):
    """One pool: a fleet-wide slot limit, a FIFO queue, and the jobs in it (`page`: jobpool/browse.py)."""

    def __init__(self, client: redis.Redis, settings: Settings | None = None, actor: str = "api") -> None:
        self.settings = settings or Settings()
        #: Who is recorded in events for this pool's actions ("api", "cli", "supervisor", ...).
        self.actor = actor
        #: The pool's Redis, and the only way to it: its keys and one typed method per script
        #: (jobpool/store/calls.py), its reads and its client (`store.client`).
        self.store = Store(client, self.settings)
        self._live = LiveText(self.store)
        self.keys = self.store.keys

    @classmethod
    def from_url(cls, url: str, name: str = "default", **settings: Any) -> Pool:
        s = Settings.from_env({}, redis_url=url, pool=name, **settings)
        return cls(connect(s.redis_url), s)

    @classmethod
    def from_env(cls, **overrides: Any) -> Pool:
        s = Settings.from_env(**overrides)
        return cls(connect(s.redis_url), s)

    @classmethod
    def from_settings(cls, settings: Settings) -> Pool:
        return cls(connect(settings.redis_url), settings)

    def close(self) -> None:
        """Close the Redis connections (the pool may be used again: redis-py reconnects)."""
        self.store.close()


    # ---- submission ---------------------------------------------------------------------------------

    def enqueue(self, image: str, command: Sequence[str], env: dict[str, str] | None = None,
                coalesce: bool = False, coalesce_key: str | None = None,
                not_before: datetime.datetime | float | None = None, after: Sequence[str] | None = None,
                **spec: Any) -> Job:
        """Queue a job; with `coalesce` (or a `coalesce_key`) return the queued job it equals, if any.

        Only queued jobs coalesce: a running job is already reading its inputs, so a job enqueued after it
        starts must run after it. The returned `Job.coalesced` says which happened (jobpool/submit.py).
        With `not_before` (a timezone-aware datetime or epoch seconds) or `after` (job ids that must succeed
        first) the job is `waiting` until then, and queued at its priority once nothing holds it; a job it
        waits for that fails or is cancelled cancels it (`dependency_failed`). The spec's `timeout`,
        `retries`, `retry_delay` and `retry_on` bound and repeat its attempts (docs/architecture.md, "Time
        and dependencies").
        """
        holds = {k: v for k, v in (("not_before", not_before), ("after", after)) if v is not None}
        return submit.enqueue(self, {"image": image, "command": command, "env": env, **spec},
                              coalesce, coalesce_key, holds)

    def retry(self, job_id: str) -> Job:
        """Run a failed or cancelled job again as a new attempt, its history kept and its retries whole
        again; it waits again for the jobs of its `after` that have not succeeded (scripts/retry_job.lua).
        A job it waits for that failed or was cancelled must be retried first (`InvalidSpec`)."""
        apichecks.check_id(job_id)
        self.store.retry_job(job_id, self.actor)
        self.store.promote_all(self.actor)
        return self.get(job_id)

    def enqueue_many(self, specs: Iterable[Mapping[str, Any]],
                     batch_size: int = BATCH_SIZE) -> builtins.list[Job]:
        """Queue many jobs in input order; each item holds `enqueue`'s arguments (`image`, `command`, `env`,
        `coalesce`, `coalesce_key`, the spec's fields). Returns their Jobs in input order.

        Every item is validated first: one refused item raises `InvalidSpec` (its `index` says which) and
        nothing is written. Then `batch_size` jobs go in each script call, one atomic step each; equal jobs in
        one batch coalesce into the first. If Redis fails midway, the input's first jobs stay enqueued: the
        error's `enqueued` says how many, a batch whose reply was lost included (`unknown`: see JobpoolError).
        """
        apichecks.check_count("batch_size", batch_size, MAX_BATCH_SIZE)
        return submit.enqueue_many(self, specs, batch_size)

    # ---- schedules (jobpool/schedules.py; docs/architecture.md, "Schedules") -----------------------------

    def add_schedule(self, name: str, *, cron: str | None = None, every: float | None = None, tz: str = "UTC",
                     misfire: str = "once", overlap: str = "skip", replace: bool = False,
                     **job: Any) -> Schedule:
        """Make a job at each tick of cron expression `cron` in time zone `tz`, or every `every` seconds (on
        multiples of it since the epoch); `job` holds `enqueue`'s arguments (image, command, env, the spec's
        fields), checked as enqueue checks them, but no not_before, after or coalesce. The first tick is the
        first after now. The supervisors fire each tick once; `misfire` says what ticks missed while none
        ran do ('once': the latest fires; 'skip': none), `overlap` what a tick does while the last job still
        waits or runs ('skip': nothing; 'queue': a job). A name that exists is `AlreadyExists` unless
        `replace` (it keeps its last tick, last job and pause)."""
        return schedules.add(self, name, job, cron, every, tz, misfire, overlap, replace)

    def schedules(self) -> builtins.list[Schedule]:
        """Every schedule, by name, with its last fire (tick and job) and its next."""
        return schedules.list_schedules(self.store)

    def remove_schedule(self, name: str) -> None:
        """Remove a schedule; the jobs it made stay (`NotFound` when there is none)."""
        schedules.remove(self.store, name, self.actor)

    def pause_schedule(self, name: str) -> Schedule:
        """Stop a schedule firing until resumed; the ticks of its pause never fire."""
        return schedules.set_paused(self.store, name, True, self.actor)

    def resume_schedule(self, name: str) -> Schedule:
        """Fire a paused schedule again, from its first tick after now."""
        return schedules.set_paused(self.store, name, False, self.actor)

    def promote(self) -> int:
        """Promote queued jobs into free slots now (the supervisor also does this every sweep)."""
        return self.store.promote_all(self.actor)

    # ---- reading ------------------------------------------------------------------------------------

    def get(self, job_id: str, coalesced: bool = False) -> Job:
        """The job's row; `CorruptRow` when it holds something that cannot be read."""
        apichecks.check_id(job_id)
        return self.store.job(job_id, coalesced)

    def _rows(self, ids: Iterable[str]) -> list[Job]:
        """The rows of `ids` that can be read; a missing row is skipped, a corrupt one skipped and logged."""
        ids = builtins.list(ids)
        return apichecks.jobs_of(ids, self.store.rows(ids), self.keys.pool)

    def list(self, state: str | JobState | None = None, limit: int = 100) -> builtins.list[Job]:
        """Jobs in one state (queued/paused in queue order, running by promotion, finished newest first),
        or, with no state, the newest `limit` jobs of every state in creation order."""
        apichecks.check_count("limit", limit, MAX_LIST)
        if state is not None:
            st = apichecks.check_state(state)
            return self._rows(self.store.state_ids(st.value, limit, newest_first=st in TERMINAL))
        jobs: builtins.list[Job] = []
        for st in JobState:
            jobs += self.list(st, limit)
        jobs.sort(key=lambda j: j.seq)
        return jobs[-limit:]

    @overload
    def logs(self, job_id: str, follow: Literal[False] = False) -> str: ...

    @overload
    def logs(self, job_id: str, follow: Literal[True]) -> Iterator[str]: ...

    def logs(self, job_id: str, follow: bool = False) -> str | Iterator[str]:
        """What the job printed: while it runs, its live log, sent by its worker about every second and
        read from Redis, whichever host runs it; once it ended, the last 64 KiB of its output, kept after
        its container is gone. With `follow`, an iterator of its lines as they are printed, which ends
        once the job has ended (jobpool/livelogs.py)."""
        apichecks.check_id(job_id)
        if follow:
            return self._live.follow(job_id)
        return self._live.now(job_id)

    def slots(self) -> tuple[int, int]:
        """(used, max) of the fleet-wide limit."""
        return self.store.slots()

    def stats(self) -> dict[str, Any]:
        """Counts per state, slots, and whether promotion is paused (by whom, why, since when)."""
        return self.store.stats()

    def trends(self) -> builtins.list[TrendPoint]:
        """The pool's history, oldest first: a point per `trend_secs` of the last TREND_POINTS, each recorded
        by a supervisor once its span ended (jobpool/trends.py); a span no supervisor recorded is missing."""
        return read_trends(self.store)

    def events(self, job_id: str | None = None, count: int = 1000,
               after: str = "-") -> builtins.list[dict[str, str]]:
        """Transitions in order, oldest first: the pool's capped stream, or one job's whole history (kept in
        its row, so found whatever else the stream holds). At most `count` (1 to events.MAX_EVENTS), from
        `after`: "-" for the start, or a stream id ("(" first: exclusive)."""
        return event_stream.read(self.store, job_id, count, after)

    def tail_events(self, job_id: str | None = None,
                    count: int = 20) -> tuple[builtins.list[dict[str, str]], str]:
        """The newest `count` events (of one job, if given), oldest first, and the stream id to give
        `follow_events` so that it goes on from them without a gap."""
        return event_stream.tail(self.store, job_id, count)

    def follow_events(self, job_id: str | None = None, after: str | None = None,
                      block_secs: float = 1.0) -> Iterator[dict[str, str]]:
        """Events written after stream id `after` (default: from now on), as they come: an iterator that
        blocks and never ends by itself (stop iterating to stop)."""
        return event_stream.follow(self.store, job_id, after, block_secs)

    def prune(self, dry_run: bool = False) -> PruneReport:
        """Remove the finished jobs past retention (`Settings.keep_*`) with everything they left; with
        `dry_run`, count them and list the first. Never touches a queued, running or paused job."""
        return retention.prune(self.store, dry_run=dry_run, actor=self.actor)

    def forget_collision(self, daemon_id: str, note: str = "") -> int:
        """Clear the standing report that two Docker daemons share identity `daemon_id`, once one of them has
        an identity of its own (jobpool/fleet/markrecords.py `forget_collision`); returns when (ms, Redis's
        clock). Raises `InvalidArgument` for an identity with no standing report, writing nothing."""
        from .fleet.markrecords import forget_collision

        return forget_collision(self, daemon_id, actor=self.actor or "operator", note=note)

    def now_ms(self) -> int:
        """Now on the Redis server's clock: the clock every time in a row, an event or a record is on."""
        return self.store.now_ms()

    def boot_is_live(self, boot_id: str) -> bool:
        """Whether a worker boot's record is still there: its process heartbeats it, a crash lets it expire
        (workers/boot.py). False for an empty id (a row no worker has claimed)."""
        return self.store.boot_is_live(boot_id)

    def status(self) -> StatusReport:
        """Slots, the queue, promotion, live workers, the last sweep and the health verdict, in one typed
        report (`to_dict()` for JSON). An unreachable Redis is an unhealthy report, not an exception."""
        return read_status(self.store)

    def health(self) -> Health:
        """The health verdict of `status()`: `healthy`, with the reasons when not, and warnings."""
        return self.status().health

    def wait(self, job_id: str, timeout: float = 60.0, states: Iterable[str | JobState] = TERMINAL,
             interval: float = 0.05) -> Job:
        """Poll until the job is in one of `states` (terminal by default; one state may be given alone);
        `JobTimeout` after `timeout` s, polling every `interval` s."""
        wanted = apichecks.check_states(states)
        apichecks.check_wait_args(timeout, interval, "interval")
        deadline = time.monotonic() + timeout
        while True:
            job = self.get(job_id)
            if job.state in wanted:
                return job
            if time.monotonic() >= deadline:
                raise errors.JobTimeout(f"job {job_id} is still {job.state} after {timeout:g}s")
            time.sleep(interval)

    # ---- control ------------------------------------------------------------------------------------

    def cancel(self, job_id: str, reason: str = "") -> Job:
        """Cancel a job. A running job is asked to stop (the request is persisted): see
        `Job.cancel_requested`."""
        apichecks.check_id(job_id)
        apichecks.check_text("reason", reason)
        self.store.finish_promotion(self.store.cancel(job_id, reason, self.actor), self.actor)
        return self.get(job_id)

    def pause(self, job_id: str | None = None, reason: str = "") -> Job | None:
        """Pause one job, or with no id the whole queue's promotion (reconciling goes on)."""
        if job_id is not None:
            apichecks.check_id(job_id)
        apichecks.check_text("reason", reason)
        if job_id is None:
            self.store.pause_queue(self.actor, reason)
            return None
        apichecks.check_id(job_id)
        self.store.finish_promotion(self.store.pause_job(job_id, reason, self.actor), self.actor)
        return self.get(job_id)

    def resume(self, job_id: str | None = None, anywhere: bool = False) -> Job | None:
        """Resume one paused job (it keeps its place), or the whole queue's promotion. `anywhere` first
        releases the job's affinity (`Job.affinity`; scripts/resume_job.lua): its daemon is gone for good."""
        if not isinstance(anywhere, bool) or (job_id is None and anywhere):
            raise errors.InvalidArgument(f"anywhere must be True (with a job id) or False, got {anywhere!r}")
        if job_id is None:
            self.store.finish_promotion(self.store.resume_queue(self.actor), self.actor)
            return None
        apichecks.check_id(job_id)
        self.store.finish_promotion(self.store.resume_job(job_id, self.actor, anywhere), self.actor)
        return self.get(job_id)

    def set_slots(self, n: int) -> int:
        """Set the fleet-wide limit; returns the old one. Lowering it stops nothing that runs."""
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= MAX_SLOTS:
            raise errors.InvalidArgument(f"slots must be a whole number from 0 to {MAX_SLOTS}, got {n!r}")
        done = self.store.set_slots(n, self.actor)
        self.store.finish_promotion(done, self.actor)
        return done.old

    # ---- named limits (docs/architecture.md, "Order and limits") --------------------------------------

    @staticmethod
    def _check_limit_name(name: Any) -> str:
        plain = name[:-1] if isinstance(name, str) and name.endswith("*") else name
        if not isinstance(plain, str) or not LIMIT_NAME.fullmatch(plain):
            raise errors.InvalidArgument(
                f"a limit is a name (1-{LIMIT_NAME_MAX_CHARS} of letters, digits and '_ . : / @ -') or "
                f"such a name followed by '*', got {name!r}")
        return str(name)

    def set_limit(self, name: str, n: int) -> int | None:
        """Set named limit `name` to `n` units (a pattern, 'prefix*', gives each name under it its own `n`);
        returns its size before (None: it is new). Lowering it stops nothing that runs: new starts wait."""
        self._check_limit_name(name)
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= MAX_LIMIT:
            raise errors.InvalidArgument(
                f"a limit's size must be a whole number from 0 to {MAX_LIMIT}, got {n!r}")
        done = self.store.set_limit(name, n, self.actor)
        self.store.finish_promotion(done, self.actor)
        return done.old

    def remove_limit(self, name: str) -> int:
        """Remove named limit `name`; returns its size. Nothing that runs is stopped; a queued job using a
        name no limit covers any more waits until one does (`NotFound` when there is no such limit)."""
        try:
            done = self.store.set_limit(self._check_limit_name(name), None, self.actor)
        except errors.NotFound:
            raise errors.NotFound(f"no limit {name} (jobpool limit lists them)") from None
        self.store.finish_promotion(done, self.actor)  # another limit may cover its names
        return int(done.old or 0)

    def why_waiting(self, job_id: str) -> builtins.list[str]:
        """What holds a queued job back, a line each: its place, a full limit and who holds it, its weight, a
        reservation ahead of it, a paused queue. For a waiting job: the jobs it waits for with their states,
        until when and why (a retry's delay, a delayed start). [] for a job in another state."""
        job = self.get(job_id)
        if job.state is JobState.WAITING:
            return waiting.why_held(self.store, job, self.store.now_ms())
        return waiting.why_waiting(self.store, job, self.store.row(job.id).get("parked", ""))

    def limits(self) -> builtins.list[LimitUse]:
        """Every named limit with its size and the units in use under it, by name."""
        return self.store.limits()

    def evict(self, job_id: str, attempt: int, reason: str = "evicted", evidence: str = "",
              actor: str = "operator", daemon_id: str = "") -> Job:
        """Fail a running job and free its slot, if it is still at `attempt` (and recorded on `daemon_id`,
        when given: the daemon the caller stopped its containers on). The caller stops the container first;
        the old owner's next fenced write is refused."""
        apichecks.check_id(job_id)
        if (not isinstance(attempt, int) or isinstance(attempt, bool)
                or not 0 <= attempt <= event_stream.UINT64_MAX):
            raise errors.InvalidArgument(f"attempt must be a whole number, got {attempt!r}")
        for name, text in (("reason", reason), ("evidence", evidence), ("actor", actor),
                           ("daemon_id", daemon_id)):
            apichecks.check_text(name, text)
        self.store.finish_promotion(self.store.evict(job_id, attempt, reason, evidence, actor, daemon_id),
                                    self.actor)
        return self.get(job_id)
