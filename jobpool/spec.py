"""`JobSpec`: what a job runs, validated before anything is written.

A spec is checked completely in Python so that a refused spec never leaves a row, an RQ hash or an event
behind. The limits keep one row small enough that listing thousands of jobs stays cheap.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .contract import (
    LABEL_PREFIX,
    LIMIT_NAME_CHARS,
    LIMIT_NAME_MAX_CHARS,
    MAX_LIMIT,
    MAX_PRIORITY,
    MAX_RETRIES,
    MAX_SLOTS,
    MAX_TIME_SECS,
    RETRY_DELAY_SECS,
)
from .errors import InvalidSpec
from .fastinit import Assembler

MAX_ARGS = 1024
MAX_ARG_BYTES = 64 * 1024
MAX_ENV = 512
MAX_CPUS = 1024
MAX_SPEC_BYTES = 256 * 1024
#: Matched whole (`fullmatch`): with `match`, a `$` would let a trailing newline through.
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MEMORY = re.compile(r"[1-9][0-9]*[bkmg]?", re.IGNORECASE)
#: The encoder of a spec's canonical JSON (what `json.dumps(..., separators=(",", ":"), sort_keys=True)`
#: gives), made once: `json.dumps` with options builds a new one on every call, a fifth of a spec's cost. It
#: does not sort: `JobSpec._json` writes the keys in sorted order itself, which costs less than its sort.
_CANONICAL = json.JSONEncoder(separators=(",", ":"))
#: A limit's name or a fair-share group (contract.py says which characters, and why so few).
LIMIT_NAME = re.compile(f"[{LIMIT_NAME_CHARS}]{{1,{LIMIT_NAME_MAX_CHARS}}}")
#: The most named limits one job may use.
MAX_USES = 32
#: Network modes that would share the host's namespaces with the job.
FORBIDDEN_NETWORKS = ("host",)


@dataclass(frozen=True)
class JobSpec:
    """A container job. `network` defaults to ``none``: a job reaches nothing unless asked."""

    image: str
    command: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict, repr=False)  # values may be secrets
    workdir: str | None = None
    user: str | None = None
    network: str = "none"
    cpus: float | None = None
    memory: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    #: "HOST:CONTAINER" or "HOST:CONTAINER:ro"; HOST must sit under a configured bind root.
    mounts: tuple[str, ...] = ()
    #: Run an init process (Docker's tini) as the container's PID 1: it forwards the stop signal to the
    #: command and reaps zombies. Without it the command is PID 1, where the kernel drops any signal the
    #: command has no handler for, so a plain `sh` ignores SIGTERM and a pause waits out the stop grace.
    init: bool = True
    #: Keep a checkpoint across attempts (the job's checkpoint directory, `contract.ENV_CHECKPOINT_DIR`): on
    #: Docker a volume per job on the daemon that ran it, which ties a handed-back job to that daemon
    #: (checkpoint affinity). False: none is made (no volume, no variable, no affinity), which saves the
    #: daemon a volume's create and removal per job.
    checkpoint: bool = True
    #: Its place among queued jobs: higher first, -MAX_PRIORITY..MAX_PRIORITY (docs/architecture.md, "Order
    #: and limits"). Equal priorities keep enqueue order, groups taking turns.
    priority: int = 0
    #: How many of the pool's slots it holds while it runs.
    slots: int = 1
    #: Units of named limits it holds while it runs: name -> amount. Every name must be covered by a limit.
    uses: Mapping[str, int] = field(default_factory=dict)
    #: Its fair-share group: among queued jobs of equal priority, promotion takes groups in turn.
    group: str | None = None
    #: Its time limit per attempt, in seconds (None: none): an attempt running longer is stopped by whoever
    #: watches it and fails with error_reason `timeout` (docs/architecture.md, "Time and dependencies").
    timeout: int | None = None
    #: How many times a failed attempt (a non-zero exit of its own, or a timeout) is tried again.
    retries: int = 0
    #: The first retry's delay in seconds, doubled for each retry after it, with jitter, at most
    #: JOBPOOL_RETRY_DELAY_MAX_SECS.
    retry_delay: int = RETRY_DELAY_SECS
    #: The exit codes that are retried (empty: any non-zero exit). A timeout is retried either way.
    retry_on: tuple[int, ...] = ()

    def retry_arg(self) -> str:
        """What the enqueue script reads of its retries (scripts/enqueue.lua): '' for none, else
        'retries;delay ms;code,code...'."""
        if not self.retries:
            return ""
        return f"{self.retries};{self.retry_delay * 1000};{','.join(map(str, self.retry_on))}"

    def schedule_arg(self) -> str:
        """What the enqueue script reads of its order and limits (scripts/enqueue.lua); '' for defaults."""
        if self.priority == 0 and self.slots == 1 and not self.uses and self.group is None:
            return ""
        uses = ",".join(f"{name}={amount}" for name, amount in self.uses.items())
        return f"{self.priority};{self.slots};{self.group or ''};{uses}"

    def to_json(self) -> str:
        """Canonical JSON (sorted keys), computed once: a spec is frozen."""
        return self._json

    @functools.cached_property
    def _json(self) -> str:
        # Every key in sorted order, env's and labels' too (tuples are written as arrays): the canonical form
        # with an encoder that does not sort (`_CANONICAL`).
        data: dict[str, Any] = {}
        # `checkpoint` and `init` are written only when off: a spec with the defaults reads as it did before
        # the fields existed, so a worker of the previous release (whose spec refuses unknown fields) still
        # runs it during a rolling upgrade, and such a job still coalesces with one queued before.
        if not self.checkpoint:
            data["checkpoint"] = False
        data["command"], data["cpus"], data["env"] = self.command, self.cpus, _sorted(self.env)
        # The order and limits, like `init` and `checkpoint`, only when not the defaults.
        if self.group is not None:
            data["group"] = self.group
        data["image"] = self.image
        if not self.init:
            data["init"] = False
        data["labels"], data["memory"], data["mounts"] = _sorted(self.labels), self.memory, self.mounts
        data["network"] = self.network
        if self.priority:
            data["priority"] = self.priority
        # Retries and the time limit, like the order and limits, only when set.
        if self.retries:
            data["retries"] = self.retries
            if self.retry_delay != RETRY_DELAY_SECS:
                data["retry_delay"] = self.retry_delay
            if self.retry_on:
                data["retry_on"] = self.retry_on
        if self.slots != 1:
            data["slots"] = self.slots
        if self.timeout is not None:
            data["timeout"] = self.timeout
        data["user"] = self.user
        if self.uses:
            data["uses"] = _sorted(self.uses)  # type: ignore[arg-type]  # ints, sorted alike
        data["workdir"] = self.workdir
        return _CANONICAL.encode(data)

    @classmethod
    def from_json(cls, text: str | bytes) -> JobSpec:
        """Read a stored spec back, checked as at enqueue (except the bind roots, which may have changed
        since): anything else raises `InvalidSpec`, never a bare JSON or type error."""
        try:
            data = json.loads(text)
        except (ValueError, TypeError) as exc:
            raise InvalidSpec(f"the spec is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise InvalidSpec(f"the spec is a JSON {type(data).__name__}, not an object")
        return build_spec(data, check_roots=False)

    def coalesce_key(self) -> str:
        """Equal specs give equal keys: a digest of the canonical JSON (short, and no env value in clear)."""
        return "spec:" + hashlib.sha256(self.to_json().encode()).hexdigest()


_FIELDS = {f for f in JobSpec.__dataclass_fields__}
#: `build_spec` makes every spec through this, every field given (jobpool/fastinit.py: why).
_assemble = Assembler(JobSpec)


def _sorted(mapping: Mapping[str, str]) -> dict[str, str]:
    """A copy of `mapping` with its keys in sorted order (one or none is sorted already)."""
    return dict(sorted(mapping.items())) if len(mapping) > 1 else dict(mapping)


def _need_str(name: str, value: Any, *, empty_ok: bool = False) -> str:
    if not isinstance(value, str) or (not empty_ok and not value):
        raise InvalidSpec(f"{name} must be a non-empty string, got {value!r}")
    if "\x00" in value:
        raise InvalidSpec(f"{name} must not contain NUL bytes")
    utf8_size(name, value)
    return value


def utf8_size(name: str, value: str) -> int:
    """The UTF-8 size of `value`; a string that has none (a lone surrogate) is refused as `InvalidSpec`."""
    try:
        return len(value.encode())
    except UnicodeEncodeError:
        raise InvalidSpec(f"{name} is not valid text (it cannot be encoded as UTF-8)") from None


def _str_map(name: str, value: Any, key_check: re.Pattern[str] | None = None) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidSpec(f"{name} must be a mapping of strings to strings")
    if len(value) > MAX_ENV:
        raise InvalidSpec(f"{name} has {len(value)} entries; at most {MAX_ENV}")
    out = {}
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise InvalidSpec(f"{name} must map strings to strings; {k!r}: {v!r} is not")
        if key_check is not None and not key_check.fullmatch(k):
            raise InvalidSpec(f"{name} key {k!r} is not a valid name")
        if not k:
            raise InvalidSpec(f"{name} key must not be empty")
        if "\x00" in k or "\x00" in v:
            raise InvalidSpec(f"{name} entry {k!r} contains a NUL byte")
        utf8_size(f"{name} entry {k!r}", k + v)
        out[k] = v
    return out


def _check_mounts(mounts: Any, bind_roots: Sequence[str], check_roots: bool = True) -> tuple[str, ...]:
    if mounts is None:
        return ()
    if isinstance(mounts, str) or not isinstance(mounts, Sequence):
        raise InvalidSpec("mounts must be a list of 'HOST:CONTAINER[:ro]' strings")
    out = []
    roots = [os.path.realpath(r) for r in bind_roots]
    for m in mounts:
        parts = _need_str("mount", m).split(":")
        if len(parts) not in (2, 3) or parts[2:] not in ([], ["ro"], ["rw"]):
            raise InvalidSpec(f"mount {m!r} is not 'HOST:CONTAINER[:ro]'")
        host, target = parts[0], parts[1]
        if not os.path.isabs(host) or not os.path.isabs(target):
            raise InvalidSpec(f"mount {m!r}: both paths must be absolute")
        if not check_roots:
            out.append(m)
            continue
        real = os.path.realpath(host)
        if not any(real == r or real.startswith(r.rstrip("/") + "/") for r in roots):
            allowed = ", ".join(bind_roots) or "none configured (JOBPOOL_BIND_ROOTS)"
            raise InvalidSpec(f"mount {m!r}: {host} is not under an allowed bind root ({allowed})")
        out.append(m)
    return tuple(out)


def _check_command(command: Any) -> tuple[str, ...]:
    if isinstance(command, (str, bytes)) or not isinstance(command, Sequence) or not command:
        raise InvalidSpec("command must be a non-empty list of strings")
    if len(command) > MAX_ARGS:
        raise InvalidSpec(f"command has {len(command)} arguments; at most {MAX_ARGS}")
    for arg in command:  # `_need_str`'s checks, the argument encoded once for both size checks
        if not isinstance(arg, str):
            raise InvalidSpec(f"command argument must be a string, got {arg!r}")
        if "\x00" in arg:
            raise InvalidSpec("command argument must not contain NUL bytes")
        if utf8_size("command argument", arg) > MAX_ARG_BYTES:
            raise InvalidSpec(f"a command argument is longer than {MAX_ARG_BYTES} bytes")
    return tuple(command)


def _check_limits(cpus: Any, memory: Any) -> tuple[float | None, str | None]:
    if cpus is not None and (isinstance(cpus, bool) or not isinstance(cpus, (int, float))
                             or not 0 < cpus <= MAX_CPUS):
        raise InvalidSpec(f"cpus must be a number above 0 and at most {MAX_CPUS}, got {cpus!r}")
    if memory is not None and (not isinstance(memory, str) or not MEMORY.fullmatch(memory)):
        raise InvalidSpec(f"memory must look like '512m' or '2g', got {memory!r}")
    return (float(cpus) if cpus is not None else None), memory


def _whole(name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidSpec(f"{name} must be a whole number from {low} to {high}, got {value!r}")
    return value


def _limit_name(what: str, value: Any) -> str:
    if not isinstance(value, str) or not LIMIT_NAME.fullmatch(value):
        raise InvalidSpec(f"{what} {value!r} is not a name (1-{LIMIT_NAME_MAX_CHARS} of letters, digits and "
                          "'_ . : / @ -')")
    return value


def _check_uses(value: Any) -> dict[str, int]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidSpec("uses must be a mapping of limit names to amounts")
    if len(value) > MAX_USES:
        raise InvalidSpec(f"uses names {len(value)} limits; at most {MAX_USES}")
    return {_limit_name("limit", k): _whole(f"uses of {k}", v, 1, MAX_LIMIT) for k, v in value.items()}


def _check_retry_on(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise InvalidSpec("retry_on must be a list of exit codes")
    codes = tuple(_whole("retry_on exit code", v, 1, 255) for v in value)
    return tuple(sorted(set(codes)))


def build_spec(fields: Mapping[str, Any], bind_roots: Sequence[str] = (),
               check_roots: bool = True) -> JobSpec:
    """Validate raw fields into a `JobSpec`, or raise `InvalidSpec` saying what is wrong. `check_roots`
    False skips only the bind-root check of mounts (a stored spec read back)."""
    if not _FIELDS.issuperset(fields):
        unknown = set(fields) - _FIELDS
        raise InvalidSpec(f"unknown spec field(s): {', '.join(sorted(unknown))} "
                          "(privileged mode and host namespaces are never allowed)")
    image = _need_str("image", fields.get("image"))
    command = _check_command(fields.get("command"))
    labels = _str_map("labels", fields.get("labels"))
    for k in labels:
        if k.startswith(LABEL_PREFIX):
            raise InvalidSpec(f"label {k!r}: the 'jobpool.' prefix is reserved for jobpool's own labels")
    network = _need_str("network", fields.get("network", "none"))
    if network in FORBIDDEN_NETWORKS or network.startswith("container:"):
        raise InvalidSpec(f"network {network!r} would share another namespace with the job; "
                          "not allowed")
    cpus, memory = _check_limits(fields.get("cpus"), fields.get("memory"))
    workdir = fields.get("workdir")
    if workdir is not None and not os.path.isabs(_need_str("workdir", workdir)):
        raise InvalidSpec(f"workdir must be an absolute path, got {workdir!r}")
    user = fields.get("user")
    if user is not None:
        _need_str("user", user)
    init, checkpoint = fields.get("init", True), fields.get("checkpoint", True)
    if not isinstance(init, bool):
        raise InvalidSpec(f"init must be true or false, got {init!r}")
    if not isinstance(checkpoint, bool):
        raise InvalidSpec(f"checkpoint must be true or false, got {checkpoint!r}")
    group, timeout = fields.get("group"), fields.get("timeout")
    spec = _assemble({
        "image": image, "command": command, "env": _str_map("env", fields.get("env"), ENV_NAME),
        "workdir": workdir, "user": user, "network": network, "cpus": cpus, "memory": memory,
        "labels": labels, "mounts": _check_mounts(fields.get("mounts"), bind_roots, check_roots),
        "init": init, "checkpoint": checkpoint,
        "priority": _whole("priority", fields.get("priority", 0), -MAX_PRIORITY, MAX_PRIORITY),
        "slots": _whole("slots", fields.get("slots", 1), 1, MAX_SLOTS),
        "uses": _check_uses(fields.get("uses")),
        "group": None if group is None else _limit_name("group", group),
        "timeout": None if timeout is None else _whole("timeout", timeout, 1, MAX_TIME_SECS),
        "retries": _whole("retries", fields.get("retries", 0), 0, MAX_RETRIES),
        "retry_delay": _whole("retry_delay", fields.get("retry_delay", RETRY_DELAY_SECS), 0, MAX_TIME_SECS),
        "retry_on": _check_retry_on(fields.get("retry_on")),
    })
    if len(spec.to_json()) > MAX_SPEC_BYTES:  # ASCII (the encoder escapes the rest), so characters are bytes
        raise InvalidSpec(f"the spec is larger than {MAX_SPEC_BYTES} bytes")
    return spec
