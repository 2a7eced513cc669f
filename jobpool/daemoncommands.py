"""Commands routed to the workers on one Docker daemon: stopping a job's container by label there, when
whoever asks (a supervisor, an operator's cancel or eviction) is attached to another daemon or to none
(docs/architecture.md, "Many hosts").

A command is queued on the daemon's list (scripts/push_command.lua, recorded in the job's events as
`stop_routed`), taken by the worker that holds the daemon's inventory lead (scripts/take_commands.lua, so each
is taken once; jobpool/workers/inventory.py runs it each period) and done there: the job's running containers
of that attempt are stopped by label, and the result is recorded in the job's events (`remote_stopped` or
`remote_stop_failed`, scripts/command_done.lua). An eviction's command also fails the job once its
container is stopped (scripts/evict.lua, compare-and-set on the attempt). A cancel needs nothing more: the
cancel is persisted on the row, and the stopped container's exit ends the job cancelled (its worker, or a
sweep).
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from typing import Any

from . import errors
from .fleet.daemonid import is_identity
from .store.calls import Store

log = logging.getLogger("jobpool.commands")

#: How long a routed command waits for a worker on its daemon (a day; a cancel is persisted on the row).
COMMAND_TTL_MS = 86400 * 1000
#: Commands a publisher takes per period.
TAKE_PER_PERIOD = 20


@dataclass(frozen=True)
class StopCommand:
    """Stop a job's containers of one attempt by label; with `evict`, then fail it with `reason`."""

    job_id: str
    attempt: int
    evict: bool = False
    reason: str = ""
    evidence: str = ""
    actor: str = ""

    def encode(self) -> str:
        return json.dumps({"op": "stop", **asdict(self)}, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str) -> StopCommand | None:
        try:
            raw = json.loads(text)
            if raw.pop("op") != "stop":
                return None
            cmd = cls(**raw)
        except (ValueError, TypeError, KeyError, AttributeError):
            return None
        return cmd if isinstance(cmd.job_id, str) and isinstance(cmd.attempt, int) else None


def routable(daemon_id: str) -> bool:
    """Whether a command can be routed to this daemon: only by an identity (jobpool/fleet/daemonid.py)."""
    return is_identity(daemon_id)


def route_stop(store: Store, daemon_id: str, command: StopCommand) -> int:
    """Queue a stop for the workers on `daemon_id`; returns how many commands wait there. Raises `Conflict`
    when the job is no longer running that attempt (nothing is queued)."""
    if not routable(daemon_id):
        raise errors.InvalidArgument(f"cannot route a command to daemon {daemon_id!r}: not an identity")
    evidence = f"stop of attempt {command.attempt} routed to the workers on daemon {daemon_id}" + (
        ", then eviction" if command.evict else "")
    return store.push_command(command.job_id, command.attempt, daemon_id, command.encode(),
                              COMMAND_TTL_MS, evidence, command.actor)


def take(store: Store, daemon_id: str, boot_id: str) -> list[StopCommand]:
    """The commands waiting for this daemon, taken by the holder of its inventory lead (NotOwner else)."""
    out = []
    for text in store.take_commands(daemon_id, boot_id, TAKE_PER_PERIOD):
        cmd = StopCommand.decode(text)
        if cmd is None:
            log.error("dropped a command routed to daemon %s that cannot be read: %r", daemon_id,
                      str(text)[:200])
        else:
            out.append(cmd)
    return out


def execute(store: Store, stopper: Any, daemon_id: str, cmd: StopCommand, actor: str) -> str:
    """Do one command on this daemon (`stopper`: a supervisor/stopper.py ContainerStopper attached to it) and
    record what was done in the job's events; returns the reason recorded."""
    try:
        stopped = stopper.stop_by_label(store.keys.pool, cmd.job_id, cmd.attempt,
                                        store.settings.stop_grace_secs)
    except Exception as exc:  # noqa: BLE001 - the daemon could not be asked: nothing was stopped
        reason, evidence = "remote_stop_failed", f"daemon {daemon_id} could not stop it: {exc}"[:500]
    else:
        reason = "remote_stopped"
        evidence = (f"stopped {len(stopped)} running container(s) of attempt {cmd.attempt} by label on "
                    f"daemon {daemon_id}: {', '.join(c[:12] for c in stopped) or 'none running'}")
    try:
        store.command_done(cmd.job_id, reason, evidence, actor)
    except errors.NotFound:
        return reason
    log.warning("job %s: %s", cmd.job_id, evidence)
    if cmd.evict and reason == "remote_stopped":
        try:
            done = store.evict(cmd.job_id, cmd.attempt, cmd.reason or "evicted", evidence, cmd.actor or actor,
                               daemon_id)
        except (errors.Conflict, errors.InvalidState, errors.NotFound) as exc:
            log.info("job %s: not evicted after its stop: %s", cmd.job_id, exc)
        else:
            store.finish_promotion(done, actor)
    return reason
