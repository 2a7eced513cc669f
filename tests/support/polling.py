"""Wait for a state with a deadline, never sleep and hope.

Integration tests watch other processes (workers, redis-server, dockerd) change state. A fixed sleep is either
too short on a loaded CI box (flaky) or too long everywhere (slow); polling with a deadline is neither, and on
timeout says what it was waiting for and what it saw last.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal, TypeVar

T = TypeVar("T")
#: What a predicate returns for "not yet" besides a value of its own type: `eventually` returns only a truthy
#: value, so its result is typed without these (`x and y` predicates give `Literal[''] | Y`, say).
NotYet = None | Literal[False, 0, "", b""]


def eventually(
    # `...`: a predicate written in a loop takes its loop variables as defaulted parameters (ruff's B023);
    # it is always called with none.
    predicate: Callable[..., T | NotYet],
    timeout: float = 10.0,
    interval: float = 0.05,
    message: str = "condition was not met",
    ignoring: tuple[type[BaseException], ...] = (),
) -> T:
    """Call `predicate` until it returns something truthy, and return that.

    Exceptions listed in `ignoring` count as "not yet" (e.g. a connection error while a server restarts).
    Raises AssertionError with `message` and the last value (or exception) once `timeout` seconds pass.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            last: object = predicate()
        except ignoring as exc:
            last = exc
        else:
            if last:
                return last  # type: ignore[return-value]
        if time.monotonic() >= deadline:
            raise AssertionError(f"{message} within {timeout}s; last value: {last!r}")
        time.sleep(interval)
