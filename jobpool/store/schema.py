"""Which layout of keys and rows a pool's Redis holds: its *schema version*, the `schema` field of the pool's
config hash (docs/architecture.md, "Upgrades").

A pool records the version that made it (scripts/enqueue.lua, as it creates the pool) or that `jobpool
migrate` last brought it to (scripts/set_schema.lua); a pool made before versions were recorded (jobpool
0.1.0) holds version 1, the first. A process knows the versions up to `contract.SCHEMA_VERSION`: meeting a
pool that records a newer one, it refuses (`PoolTooNew`, one line) before its first state change, and again
at its first state change once `RECHECK_SECS` have passed (a pool migrated under a running process of the
older release), so an older release never writes into a layout it does not know.
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

from .. import errors
from ..contract import SCHEMA_VERSION

#: The config hash field that holds the version.
FIELD = "schema"
#: How often a long-running process looks at the version again, at its next state change.
RECHECK_SECS = 60.0
#: The version of a pool that records none: made by jobpool 0.1.0, before versions were recorded.
UNRECORDED = 1


def release() -> str:
    """This jobpool's version, as installed (what `jobpool --version` says)."""
    try:
        return metadata.version("jobpool")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "(not installed)"


def stored_version(raw: Any) -> int:
    """The version a pool records (`raw`: its config field as read), `UNRECORDED` for none; a value that is
    not a whole number is a version no release wrote: refused as newer than any."""
    if raw is None or raw in ("", b""):
        return UNRECORDED
    try:
        return int(raw)
    except (TypeError, ValueError):
        raise errors.PoolTooNew(f"the pool records a layout version jobpool cannot read ({raw!r}); this "
                                f"jobpool {release()} knows versions up to {SCHEMA_VERSION}") from None


def refuse_newer(pool: str, raw: Any) -> int:
    """The pool's version; `PoolTooNew` if this release does not know it."""
    version = stored_version(raw)
    if version > SCHEMA_VERSION:
        raise errors.PoolTooNew(f"pool {pool} holds layout version {version}, newer than this jobpool "
                                f"{release()} knows (up to {SCHEMA_VERSION}): upgrade jobpool on this host")
    return version
