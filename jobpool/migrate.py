"""`jobpool migrate`: bring a pool's Redis to the layout of keys and rows this release writes (its schema
version: jobpool/store/schema.py), explicitly, never as a side effect of another command.

A release that changes the layout raises `contract.SCHEMA_VERSION` and adds its step to `STEPS`: a function
that rewrites what the previous version left, safe to run again on what it already rewrote (idempotent), and
safe to stop anywhere (each key it rewrites is one Lua script, so a key is old or new, never half). The
version is recorded after each step (scripts/set_schema.lua), so a migrate that stopped is run again and
resumes at the step it did not finish. What order to upgrade a fleet's processes in is in
docs/architecture.md, "Upgrades".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .contract import SCHEMA_VERSION
from .store.calls import Store
from .store.schema import UNRECORDED

#: STEPS[n - 1] takes a pool from version n to n + 1 and says in a line what it did. None yet: version 1 is
#: jobpool 0.1.0's layout, which this release reads and writes as it is.
STEPS: tuple[Callable[[Store], str], ...] = ()
assert len(STEPS) == SCHEMA_VERSION - UNRECORDED, "a step for every version after the first"


@dataclass(frozen=True)
class Migration:
    """What `migrate` found and did."""

    pool: str
    #: The version the pool held, and whether it recorded it (a pool of jobpool 0.1.0 records none).
    before: int
    recorded: bool
    after: int
    #: What each step did (would do, with `dry_run`), in order.
    steps: tuple[str, ...]
    dry_run: bool

    def to_dict(self) -> dict[str, object]:
        return {"pool": self.pool, "before": self.before, "recorded": self.recorded, "after": self.after,
                "steps": list(self.steps), "dry_run": self.dry_run}

    def line(self) -> str:
        if self.before == self.after and self.recorded:
            return f"pool {self.pool}: layout version {self.after}, as this release writes it: nothing to do"
        verb = "would" if self.dry_run else "did"
        done = [f"version {self.before} -> {self.after}: {verb}: {s}" for s in self.steps] or [
            f"version {self.after}: {'would record' if self.dry_run else 'recorded'} it (nothing to rewrite)"]
        return f"pool {self.pool}: " + "; ".join(done)


def migrate(store: Store, dry_run: bool = False) -> Migration:
    """Run the steps from the pool's version to this release's, recording each; `PoolTooNew` (nothing
    written) for a pool newer than this release."""
    before = store.check_schema()
    recorded = store.recorded_schema() is not None
    version, steps = before, []
    for step in STEPS[before - UNRECORDED:]:
        steps.append("(dry run)" if dry_run else step(store))
        version += 1
        if not dry_run:
            store.set_schema(version)
    if not dry_run and not recorded and version == before:
        store.set_schema(version)
    return Migration(store.keys.pool, before, recorded, version if not dry_run else SCHEMA_VERSION,
                     tuple(steps), dry_run)
