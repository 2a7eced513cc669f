"""Python's cyclic garbage collector held off for one pass over a large fleet's state.

A sweep holds every running row it read while it allocates as many objects again to judge them (a decoded
inventory is a list a container). Each allocation-heavy step makes the collector walk everything alive, and
with a large fleet that walk, not the sweep's own work, took most of the sweep's CPU (BENCHMARKS.md, "Scale
(issue #27)", part 1). Nothing a pass builds needs the collector to be freed: its objects are freed by
reference counting as the pass drops them, so the collector waits for the pass to end and then runs as ever.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Collection held off for the block. The collector is process-wide: a block entered while it is off
    (another thread's pass, or a caller that turned it off) leaves it as it found it."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
