"""`jobpool`: the admin CLI, one click group over a pool's public operations (jobpool/operations.py) and,
lazily, the worker, supervisor and `up`.

Every command validates its input before it connects, so a refused command writes nothing. Errors are one
line on stderr: exit 2 for bad input (flags, arguments, a bad ``JOBPOOL_*`` value, a refused job spec),
exit 1 for failures (unknown job, illegal transition, Redis unreachable, an unhealthy `status`).
With ``--json`` each command prints exactly one JSON document on stdout (`events --follow`: JSON lines).
"""

from __future__ import annotations

from . import jobs, pool, process, schedules
from .app import cli

for _module in (jobs, pool, process, schedules):
    for _command in _module.COMMANDS:
        cli.add_command(_command)

#: The console script (pyproject.toml) and `python -m jobpool.cli` (__main__.py).
main = cli

__all__ = ["cli", "main"]
