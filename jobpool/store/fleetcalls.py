"""`FleetCalls`: the fleet's records of its Docker daemons, each one script: a daemon's inventory lead and
its inventory, the commands routed to the workers on a daemon, a daemon declared gone or back, and each
process's mark on its daemon with the collisions they report (docs/architecture.md, "Many hosts" and "The
daemon's identity").
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import redis

from .keys import PoolKeys
from .replies import CollisionCleared, DaemonBoots, Lead, Marked, MarkRound
from .runner import call_redis, wrap_redis_error
from .scriptcalls import ScriptCalls

#: PTTL's answers for a key that is gone, and for one that has no expiry.
PTTL_GONE, PTTL_NO_EXPIRY = -2, -1


class FleetCalls(ScriptCalls):
    """The fleet's script calls (a part of `store.calls.Store`)."""

    def inventory_lead(self, daemon_id: str, boot_id: str, lead_ms: int, look_boots: bool = False,
                       boots_before: int | None = None) -> Lead:
        """Take or renew a daemon's inventory lead (scripts/inventory_lead.lua), or learn who holds it and
        how long its lead has left (`Lead.lapse_ms`). The holder is read first, and the script runs only when
        the lead is free or this boot's: a GET and a PTTL, not a script, for each of the many followers of a
        large fleet. A lead lapsing just after the read is taken at the follower's next look, as it would be
        had it lapsed just after the script ran.

        With `look_boots`, the reads of the worker's look for earlier boots of its daemon
        (`queue_boots_reads`, with `boots_before`) go down the same round trip as the holder's read:
        `Lead.boots`, or the error one of them met."""
        key = self.keys.inventory_lead(daemon_id)
        pipe = self.client.pipeline(transaction=False)
        pipe.get(key)
        pipe.pttl(key)
        if look_boots:
            queue_boots_reads(pipe, self.keys, daemon_id, boots_before)
        replies = call_redis(pipe.execute, raise_on_error=False, what="reading the inventory lead")
        holder, left = replies[0], replies[1]
        boots_read: DaemonBoots | Exception | None = None
        for reply in (holder, left):
            if isinstance(reply, redis.RedisError):
                raise wrap_redis_error(reply, "reading the inventory lead")
        if look_boots:
            try:
                boots_read = boots_of(replies[2:])
            except (redis.RedisError, ValueError, TypeError) as exc:  # an index entry that is no number
                boots_read = exc
        # PTTL right after the GET, not in one transaction: a lead that lapsed and was taken in between reads
        # as the new holder's, which cannot lapse sooner either; one that lapsed in between (-2) is free now,
        # and the script below takes it.
        if holder and holder != boot_id and left != PTTL_GONE:
            lapse = None if left == PTTL_NO_EXPIRY else max(0, int(left))
            return Lead(held=False, holder=str(holder), boots=boots_read, lapse_ms=lapse)
        reply = self.run("inventory_lead", [key], [daemon_id, boot_id, lead_ms])
        held = bool(int(reply[1]))
        # Taken by another between the reads and the script: its lead is new, but how long it lasts is not
        # read here, so the follower reads it again at its next period.
        return Lead(held=held, holder=str(reply[2]), boots=boots_read, lapse_ms=None if held else 0)

    def publish_inventory(self, daemon_id: str, boot_id: str, kernel_boot_id: str, lead_ms: int,
                          ttl_ms: int, complete: bool, containers: str, forget_ms: int, listed_at: int,
                          strays: str) -> int:
        """Write a daemon's inventory whole (by the holder of its lead); returns its `at` (ms)."""
        k = self.keys
        reply = self.run("publish_inventory", [k.inventory(daemon_id), k.inventory_lead(daemon_id),
                                               k.inventories, k.gone_daemons, k.returned_daemons],
                         [daemon_id, boot_id, kernel_boot_id, lead_ms, ttl_ms, "1" if complete else "0",
                          containers, forget_ms, listed_at, strays])
        return int(reply[1])

    def push_command(self, job_id: str, attempt: int, daemon_id: str, command: str, ttl_ms: int,
                     evidence: str, actor: str) -> int:
        """Route a command to the workers on `daemon_id`; returns how many wait there."""
        reply = self.run("push_command", [self.keys.job(job_id), self.keys.commands(daemon_id)],
                         [job_id, attempt, daemon_id, command, ttl_ms, evidence, actor])
        return int(reply[1])

    def take_commands(self, daemon_id: str, boot_id: str, most: int) -> list[str]:
        """The commands routed to `daemon_id`, oldest first, taken by the holder of its lead."""
        k = self.keys
        reply = self.run("take_commands", [k.commands(daemon_id), k.inventory_lead(daemon_id)],
                         [boot_id, most])
        return [str(text) for text in reply[1:]]

    def command_done(self, job_id: str, reason: str, evidence: str, actor: str) -> str:
        """Record in a job's events what a worker did on its daemon; returns the job's state."""
        return str(self.run("command_done", [self.keys.job(job_id)], [job_id, reason, evidence, actor])[1])

    def forget_daemon(self, daemon_id: str, stale_ms: int, actor: str, note: str,
                      rows: Sequence[str]) -> int:
        """Declare a daemon gone for good; `rows` are the ids of the running jobs read as on it. Returns when
        (ms)."""
        k = self.keys
        reply = self.run("forget_daemon", [k.gone_daemons, k.inventory(daemon_id), k.commands(daemon_id),
                                           k.inventory_lead(daemon_id), k.inventories,
                                           *(k.job(job_id) for job_id in rows)],
                         [daemon_id, stale_ms, actor, note])
        return int(reply[1])

    def unforget_daemon(self, daemon_id: str, actor: str, note: str, keep_ms: int) -> int:
        reply = self.run("unforget_daemon", [self.keys.gone_daemons, self.keys.returned_daemons],
                         [daemon_id, actor, note, keep_ms])
        return int(reply[1])

    def daemon_mark(self, process_id: str, ttl_ms: int, forget_ms: int, fields: Iterable[tuple[str, str]],
                    scan_ms: int = 0) -> Marked:
        """Register (or refresh) one process that marked its Docker daemon, its record's `fields` in order
        (`daemon_id` among them: the identity's index it enters; a `collision` reported is recorded).
        `scan_ms`: the caller takes the pool's turn to index unindexed records for that long when no one
        holds it (`Marked.scan`; 0: never)."""
        k = self.keys
        keys, args, given = self._mark_call(process_id, ttl_ms, forget_ms, fields, scan_ms)
        # A report of a collision is recorded in `shared_daemons` too, by a script of its own: the period's
        # refresh, the common call, runs a script without the event's definitions (jobpool/store/luatext.py).
        if given.get("collision"):
            reply = self.run("daemon_collision", [*keys, k.shared_daemons], args)
        else:
            reply = self.run("daemon_mark", keys, args)
        return Marked(at=int(reply[1]), recorded=bool(int(reply[2])), scan=bool(int(reply[3])))

    def _mark_call(self, process_id: str, ttl_ms: int, forget_ms: int, fields: Iterable[tuple[str, str]],
                   scan_ms: int) -> tuple[list[str], list[Any], dict[str, str]]:
        """The KEYS and ARGV every script that writes a mark record takes first (_lib.lua `write_mark`), and
        the fields as given."""
        k = self.keys
        args: list[Any] = [process_id, ttl_ms, forget_ms, scan_ms]
        given = dict(fields)
        for name, value in given.items():
            args += [name, value]
        keys = [k.daemon_mark(process_id), k.daemon_marks, k.daemon_marks_of(given.get("daemon_id", "")),
                k.daemon_marks_scan, k.daemon_mark_v(process_id)]
        return keys, args, given

    def daemon_mark_round(self, process_id: str, ttl_ms: int, forget_ms: int,
                          fields: Iterable[tuple[str, str]], scan_ms: int,
                          peers: Sequence[tuple[str, str]]) -> MarkRound:
        """A comparing process's period in one script (scripts/daemon_mark_round.lua): its record refreshed
        as `daemon_mark` does (no `collision` among `fields`: a report goes through `daemon_mark`), then its
        identity's index, the standing collision on it and the records of `peers` (the processes found in
        that index last period, each with the `v` of its record as last read, '' for none: one still so is
        not read again) read after it."""
        k = self.keys
        keys, args, _ = self._mark_call(process_id, ttl_ms, forget_ms, fields, scan_ms)
        keys += [k.shared_daemons, *(k.daemon_mark(p) for p, _ in peers),
                 *(k.daemon_mark_v(p) for p, _ in peers)]
        reply = self.run("daemon_mark_round", keys, args + [v for _, v in peers])
        records = {}
        unchanged = set()
        for (process_id_, _), flat in zip(peers, reply[7:], strict=True):
            if isinstance(flat, list):
                records[process_id_] = {str(flat[i]): str(flat[i + 1]) for i in range(0, len(flat) - 1, 2)}
            else:
                unchanged.add(process_id_)
        standing = None if reply[4] is None else str(reply[4])
        ids = tuple(str(i) for i in reply[5])
        return MarkRound(Marked(at=int(reply[1]), recorded=False, scan=bool(int(reply[3]))), standing, ids,
                         records, frozenset(unchanged), complete=int(reply[6]) <= len(ids))

    def daemon_mark_index(self, records: Iterable[tuple[str, str]]) -> int:
        """Index records written without their identity's index entry: (process id, its `daemon_id` as read),
        each only if it still says so and still lacks one. Returns how many were indexed."""
        k = self.keys
        keys: list[str] = []
        args: list[Any] = []
        for process_id, daemon_id in records:
            keys += [k.daemon_mark(process_id), k.daemon_marks_of(daemon_id)]
            args += [process_id, daemon_id]
        if not keys:
            return 0
        return int(self.run("daemon_mark_index", keys, args)[1])

    def daemon_unmark(self, process_id: str, daemon_id: str = "") -> bool:
        """Remove a process's mark record (and its entry in `daemon_id`'s index); True when it was there."""
        k = self.keys
        keys = [k.daemon_mark(process_id), k.daemon_marks, k.daemon_mark_v(process_id)]
        if daemon_id:
            keys.append(k.daemon_marks_of(daemon_id))
        reply = self.run("daemon_unmark", keys, [process_id])
        return bool(int(reply[1]))

    def forget_collision(self, daemon_id: str, actor: str, note: str,
                         process_ids: Iterable[str]) -> CollisionCleared:
        """Clear the standing collision on `daemon_id`, and the reports in the records of `process_ids`."""
        k = self.keys
        ids = list(process_ids)
        reply = self.run("forget_collision", [k.shared_daemons, *(k.daemon_mark(i) for i in ids),
                                              *(k.daemon_mark_v(i) for i in ids)], [daemon_id, actor, note])
        return CollisionCleared(at=int(reply[1]), cleared=int(reply[2]))


def queue_boots_reads(pipe: Any, keys: PoolKeys, daemon_id: str, before_ms: int | None) -> None:
    """Queue on `pipe` the three reads `boots_of` makes a `DaemonBoots` of: when each daemon last published
    (only those last published before `before_ms` when given: an earlier boot is one of them, and a fleet's
    live daemons are not), when `daemon_id` first published, and the server's time."""
    pipe.zrangebyscore(keys.inventories, "-inf", "+inf" if before_ms is None else f"({before_ms}",
                       withscores=True)
    pipe.hget(keys.inventory(daemon_id), "first_at")
    pipe.time()


def boots_of(replies: Sequence[Any]) -> DaemonBoots:
    """The `DaemonBoots` of the three replies `queue_boots_reads` queued; the first error reply among them is
    raised."""
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    index, first, (secs, micros) = replies
    return DaemonBoots({str(d): int(at) for d, at in index}, first, int(secs) * 1000 + int(micros) // 1000)
