"""Redis's own account of what it did, for bench/scale.py: its CPU and its per-command counters read from
the server itself (never guessed from the client's clock), and SLOWLOG at a threshold of 0 as a profiler that
names each script.

Why SLOWLOG and not only INFO commandstats for time: on Redis 7.0 commandstats counts a script's own
`redis.call()`s and a transaction's commands under their own names as well as inside EVALSHA's or EXEC's time,
so a sum over commandstats counts nested work twice. SLOWLOG at threshold 0 logs every command with its
duration, its arguments (a script by its SHA) and its client; the commands a script calls are logged too,
from the client `?:0` (Lua's), which `top_level` leaves out; EXEC is not logged itself, only the commands it
ran. So the top-level entries add up to the server's time in commands, each one attributable. Recording
costs the server some CPU, so no CPU figure is read while it records.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import statistics
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from jobpool.store.luatext import script_text
from jobpool.store.runner import SCRIPT_NAMES

#: The client name the benchmark's own admin connection gives itself, so its reads are left out.
ADMIN_NAME = "scale-bench-admin"
#: Lua's own client, as SLOWLOG names it: the commands a script ran, already inside the script's time.
LUA_CLIENT = "?:0"


def admin(url: str) -> redis.Redis:
    """A connection for reading the server's counters, named so that SLOWLOG profiles leave it out."""
    client = redis.Redis.from_url(url, decode_responses=True, client_name=ADMIN_NAME)
    client.ping()
    return client


def cpu_secs(client: redis.Redis) -> float:
    """The server process's CPU so far (INFO cpu: user + system seconds, the main thread and the rest)."""
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def commandstats(client: redis.Redis) -> dict[str, tuple[int, int]]:
    """(calls, usec) per command so far (INFO commandstats); nested calls counted under their own names
    too."""
    info = client.info("commandstats")
    return {k.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"])) for k, v in info.items()}


def stats_delta(before: Mapping[str, tuple[int, int]],
                after: Mapping[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
    """What each command added between two `commandstats` readings (commands that did not run left out), the
    readings' own INFO calls excluded."""
    out = {}
    for name, (calls, usec) in after.items():
        c0, u0 = before.get(name, (0, 0))
        if calls - c0 and name != "info":
            out[name] = (calls - c0, usec - u0)
    return out


def calls_of(delta: Mapping[str, tuple[int, int]]) -> int:
    return sum(c for c, _ in delta.values())


def script_names() -> dict[str, str]:
    """SHA -> script name, for every script jobpool loads (its SHA is that of its text: store/luatext.py)."""
    return {hashlib.sha1(script_text(name).encode()).hexdigest(): name for name in SCRIPT_NAMES}


@dataclass(frozen=True)
class Entry:
    """One SLOWLOG entry: its duration (us), its arguments as Redis kept them (at most 32, each cut at 128
    characters), and the client that sent it (address, name)."""

    usec: int
    args: tuple[str, ...]
    addr: str
    name: str

    @property
    def command(self) -> str:
        return self.args[0].upper() if self.args else ""

    def first_key(self) -> str:
        """The first key the command names ('' for none): a script's first KEYS entry, else its first
        argument."""
        if self.command in ("EVALSHA", "EVAL"):
            return self.args[3] if len(self.args) > 3 and self.args[2] != "0" else ""
        return self.args[1] if len(self.args) > 1 else ""


def parse_slowlog(raw: Iterable[Any]) -> list[Entry]:
    """SLOWLOG GET's raw reply as `Entry`s, oldest first."""
    out = []
    for item in raw:
        args = tuple(a.decode(errors="replace") if isinstance(a, bytes) else str(a) for a in item[3])
        addr = item[4].decode() if isinstance(item[4], bytes) else str(item[4])
        name = item[5].decode() if isinstance(item[5], bytes) else str(item[5])
        out.append((int(item[0]), Entry(int(item[2]), args, addr, name)))
    return [e for _, e in sorted(out, key=lambda p: p[0])]


def top_level(entries: Iterable[Entry]) -> list[Entry]:
    """The commands clients sent: not those a script ran (inside its time already), nor the benchmark's
    own."""
    return [e for e in entries if e.addr != LUA_CLIENT and e.name != ADMIN_NAME]


def label(entry: Entry, names: Mapping[str, str]) -> str:
    """What an entry is, for a profile: `script <name>` for jobpool's scripts, else the command's name."""
    if entry.command == "EVALSHA" and len(entry.args) > 1:
        return f"script {names.get(entry.args[1], entry.args[1][:12])}"
    return entry.command


_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{16,}")


def key_kind(key: str) -> str:
    """A key with its ids (hex digits, uuids) as `*` and a pool's prefix dropped: what kind of key it is."""
    kind = _ID.sub("*", key)
    return re.sub(r"^jobpool:\{[^}]*\}:", "", kind)


def label_key(entry: Entry, names: Mapping[str, str]) -> str:
    """`label` and the kind of its first key: `HMGET job:*`."""
    key = entry.first_key()
    return f"{label(entry, names)} {key_kind(key)}" if key else label(entry, names)


#: A command's duration is capped at this many times the median of its kind (and at least `CAP_FLOOR_US`): a
#: duration is wall time, and a redis-server preempted on a loaded host shows as one command lasting
#: milliseconds (an EXEC's MULTI at 2 ms), which would otherwise decide a sum.
CAP_TIMES = 10
CAP_FLOOR_US = 20


def capped(durations: Sequence[int]) -> list[int]:
    """`durations` with each capped (see `CAP_TIMES`)."""
    if not durations:
        return []
    cap = max(CAP_TIMES * statistics.median(durations), CAP_FLOOR_US)
    return [min(d, int(cap)) for d in durations]


def profile(entries: Iterable[Entry], names: Mapping[str, str],
            how: Callable[[Entry, Mapping[str, str]], str] = label) -> dict[str, tuple[int, int]]:
    """(calls, usec) per `label` (or per `how`), the costliest first; durations `capped` by kind."""
    durations: dict[str, list[int]] = {}
    for e in entries:
        durations.setdefault(how(e, names), []).append(e.usec)
    usec = {k: sum(capped(v)) for k, v in durations.items()}
    return {k: (len(durations[k]), usec[k]) for k in sorted(durations, key=lambda k: (-usec[k], k))}


def script_split(entries: Sequence[Entry], names: Mapping[str, str]) -> dict[str, tuple[int, int, int, int]]:
    """Per script: (calls, server us, us of the commands it ran, how many), the costliest first. A script runs
    alone, and Redis logs the commands it ran just before the script itself (`parse_slowlog` keeps that
    order), so the entries of Lua's client right before an EVALSHA are that script's. The difference is the
    script's own Lua work: its definitions run at every call, its arguments read, its replies built.
    A script's durations are `capped` as `profile` caps them, the commands it ran at most its own."""
    runs: dict[str, list[tuple[int, int, int]]] = {}
    pending: list[Entry] = []
    for e in entries:
        if e.addr == LUA_CLIENT:
            pending.append(e)
            continue
        if e.command == "EVALSHA" and e.name != ADMIN_NAME:
            runs.setdefault(label(e, names).removeprefix("script "), []).append(
                (e.usec, sum(p.usec for p in pending), len(pending)))
        pending = []
    out = {}
    for name, rows in runs.items():
        tops = capped([r[0] for r in rows])
        out[name] = (len(rows), sum(tops), sum(min(r[1], t) for r, t in zip(rows, tops, strict=True)),
                     sum(r[2] for r in rows))
    return dict(sorted(out.items(), key=lambda kv: -kv[1][1]))


def show_scripts(split: Mapping[str, tuple[int, int, int, int]], indent: str = "    ") -> str:
    lines = []
    for name, (calls, usec, inner, n) in split.items():
        lines.append(f"{indent}{name:<20} {calls:7d} calls {usec / calls:7.1f} us each, of which its "
                     f"{n / calls:5.1f} redis.call()s {inner / calls:6.1f} us, Lua's own work "
                     f"{(usec - inner) / calls:6.1f} us")
    return "\n".join(lines)


@contextlib.contextmanager
def slowlog_all(client: redis.Redis, max_len: int) -> Iterator[list[Entry]]:
    """Log every command (threshold 0) while the block runs; the list it yields is filled with the entries on
    the way out (oldest first), and the server's settings are put back. `max_len` bounds the memory: the
    oldest entries past it are dropped (`len(entries) == max_len` says the window was too long)."""
    old = {k: str(v) for k, v in client.config_get("slowlog-*").items()}
    client.config_set("slowlog-max-len", max_len)
    client.slowlog_reset()
    client.config_set("slowlog-log-slower-than", 0)
    entries: list[Entry] = []
    try:
        yield entries
    finally:
        client.config_set("slowlog-log-slower-than", old["slowlog-log-slower-than"])
        raw = client.execute_command("SLOWLOG", "GET", "-1", NEVER_DECODE=True)
        client.slowlog_reset()
        client.config_set("slowlog-max-len", old["slowlog-max-len"])
        entries.extend(parse_slowlog(raw))


def show_profile(prof: Mapping[str, tuple[int, int]], per: float, unit: str, top: int = 12,
                 indent: str = "    ") -> str:
    """A profile as lines: calls and server time per `unit` (each divided by `per`) and its share."""
    total = sum(u for _, u in prof.values()) or 1
    lines = []
    for what, (calls, usec) in list(prof.items())[:top]:
        lines.append(f"{indent}{what:<28} {calls / per:10.1f} calls {usec / per:11.1f} us per {unit}"
                     f"  {100 * usec / total:5.1f} %")
    rest = list(prof.values())[top:]
    if rest:
        lines.append(f"{indent}{'(the rest)':<28} {sum(c for c, _ in rest) / per:10.1f} calls "
                     f"{sum(u for _, u in rest) / per:11.1f} us per {unit}")
    return "\n".join(lines)
