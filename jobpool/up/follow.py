"""How a shell finds the Redis of the `jobpool up` running from its state directory: through the state file
(`.jobpool/up.json`, written by jobpool/up/stack.py), but only while the stack it names is alive.

A state file can outlive its stack: `up` SIGKILLed leaves it behind once every process it names is gone, and
the port it names may then be another Redis's. Followed blindly, `jobpool enqueue` would write into a pool
nobody runs. So the file is followed only when both hold:

- the `up` process it names is that very process, alive (pid and start time: jobpool/procid.py);
- the Redis at its URL holds the stack id `up` wrote into it when it started (`PoolKeys.up_stack`, a random
  id also recorded in the file): the same Redis, not another one that took the port.

Otherwise `StackGone` says so in one line, before anything is written. Only a read (GET) ever reaches the
Redis at the URL. A file without a stack id (written by an older `up`) is judged by its process alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..procid import same_process_alive
from ..store import redisurl
from ..store.keys import PoolKeys
from ..store.upstack import holds_stack_id

#: How long the check waits for the Redis named in the file (a local one: it answers at once or not at all).
CHECK_TIMEOUT_SECS = 2.0


class StackGone(ConfigError):
    """The state file names a `jobpool up` stack that is gone: no Redis URL can be taken from it."""


def read(path: Path) -> dict[str, Any] | None:
    """The state file's contents; None when there is none (or it is not a JSON object: being written)."""
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def live_url(path: Path) -> str | None:
    """The Redis URL of the stack the state file at `path` names, if there is a file; `StackGone` when its
    stack is gone (see the module's docstring)."""
    state = read(path)
    if state is None:
        return None
    url = state.get("redis_url")
    if not isinstance(url, str):
        return None
    gone = f"the jobpool up stack that {path} names is gone"
    advice = "start `jobpool up` again, or give --redis-url or JOBPOOL_REDIS_URL"
    named = state.get("processes")
    up = next((p for p in named if isinstance(p, dict) and p.get("name") == "up"), None) \
        if isinstance(named, list) else None
    if up is None or same_process_alive(up) is False:
        raise StackGone(f"{gone} (its `up` process, pid {state.get('pid', '?')}, has exited); {advice}")
    stack_id = state.get("stack_id")
    if isinstance(stack_id, str) and not _holds(url, state.get("pool"), stack_id):
        raise StackGone(f"{gone} (the Redis at {redisurl.safe(url)} is not the one it started); {advice}")
    return url


def _holds(url: str, pool: Any, stack_id: str) -> bool:
    """Whether the Redis at `url` holds `stack_id` under the stack key of `pool`. A Redis that does not
    answer is given the benefit of the doubt (True): the stack's process lives, so the command that follows
    meets the outage itself and says so."""
    try:
        key = PoolKeys(pool if isinstance(pool, str) else "default").up_stack
    except ConfigError:
        return False
    # None: not asked (no answer, or a URL no client can be made from: Settings refuses it, naming it).
    return holds_stack_id(url, key, stack_id, CHECK_TIMEOUT_SECS) is not False
