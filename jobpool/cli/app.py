"""The `jobpool` click group itself: global options, the state every command shares, and the one place
errors become a line on stderr and an exit code. The commands are in the sibling modules
(jobpool/cli/__init__.py adds them to the group).
"""

from __future__ import annotations

import functools
import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import click
import redis

from .. import errors
from ..api import Pool
from ..config import Settings
from ..operations import PoolOperations
from ..store.runner import wrap_redis_error

#: Bad input: refused before anything was written, so a usage error (exit 2), not a failure (exit 1).
USAGE_ERRORS = (errors.ConfigError, errors.InvalidSpec, errors.InvalidArgument)

HELP = """Admin CLI for a jobpool: long container jobs under a hard, fleet-wide concurrency limit.

Global options may also come from JOBPOOL_REDIS_URL and JOBPOOL_POOL, and may be given after the command
too (`jobpool ls --json`). Exit codes: 0 ok, 1 failure (or `status` unhealthy), 2 bad input.

\b
Shell completion (bash; zsh and fish likewise, with zsh_source / fish_source):
  eval "$(_JOBPOOL_COMPLETE=bash_source jobpool)"
"""


class Failure(click.ClickException):
    """One line on stderr (``Error: …``) and exit 1 (a failure); never a traceback."""

    exit_code = 1


class BadInput(Failure):
    """One line on stderr and exit 2: the input was refused, nothing was done."""

    exit_code = 2


@dataclass
class CliState:
    """The global options, merged from the group and the command, and the pool built from them once."""

    redis_url: str | None = None
    pool_name: str | None = None
    as_json: bool = False
    _settings: Settings | None = field(default=None, repr=False)
    _pool: PoolOperations | None = field(default=None, repr=False)

    def merge(self, redis_url: str | None, pool_name: str | None, as_json: bool) -> None:
        self.redis_url = redis_url or self.redis_url
        self.pool_name = pool_name or self.pool_name
        self.as_json = self.as_json or as_json

    def settings(self) -> Settings:
        """Settings from ``JOBPOOL_*`` and the flags; a bad value is a usage error naming the variable."""
        if self._settings is None:
            self._settings = Settings.from_env(redis_url=self.redis_url, pool=self.pool_name)
        return self._settings

    def pool(self) -> PoolOperations:
        """The pool (no round trip yet: redis-py connects on first use); closed when the CLI exits. The one
        place the CLI makes a `Pool`: the commands call it through `PoolOperations`."""
        if self._pool is None:
            pool = Pool.from_settings(self.settings())
            pool.actor = "cli"
            click.get_current_context().find_root().call_on_close(pool.close)
            self._pool = pool
        return self._pool

    def emit(self, doc: Any, human: Callable[[], str | None]) -> None:
        """Print `doc` as JSON, or the human text `human()` gives (None prints nothing)."""
        if self.as_json:
            click.echo(json.dumps(doc, sort_keys=True))
        else:
            text = human()
            if text is not None:
                click.echo(text)


def _global_options(group: bool) -> list[Callable[[Any], Any]]:
    """The options every command shares; read from the environment at group level only, so a flag given
    before the command is never overridden by the environment after it."""
    return [
        click.option("--redis-url", envvar="JOBPOOL_REDIS_URL" if group else None, metavar="URL",
                     help="Redis holding the pool [env JOBPOOL_REDIS_URL; default: that of the `jobpool up` "
                          "running from JOBPOOL_STATE_DIR (./.jobpool), else redis://127.0.0.1:6379/0]."),
        click.option("--pool", "pool_name", envvar="JOBPOOL_POOL" if group else None, metavar="NAME",
                     help="Pool name [env JOBPOOL_POOL; default 'default']."),
        click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout."),
    ]


def _apply(options: list[Callable[[Any], Any]]) -> Callable[[Any], Any]:
    def decorate(fn: Any) -> Any:
        for option in reversed(options):
            fn = option(fn)
        return fn

    return decorate


def pool_command(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Give a command the shared options and call it with the merged `CliState` first."""

    @functools.wraps(fn)
    def wrapper(*args: Any, redis_url: str | None, pool_name: str | None, as_json: bool,
                **kwargs: Any) -> Any:
        state = click.get_current_context().ensure_object(CliState)
        state.merge(redis_url, pool_name, as_json)
        return fn(state, *args, **kwargs)

    decorated: Callable[..., Any] = _apply(_global_options(group=False))(wrapper)
    return decorated


class JobpoolGroup(click.Group):
    """Turns every jobpool error into one line and an exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            try:
                return super().invoke(ctx)
            except redis.RedisError as exc:  # met outside the API (a process command): mapped the same way
                raise wrap_redis_error(exc, ctx.invoked_subcommand or "jobpool") from None
        except USAGE_ERRORS as exc:
            raise BadInput(str(exc)) from None
        except errors.JobpoolError as exc:
            raise Failure(str(exc)) from None
        except Exception as exc:
            # The process commands may meet an unreachable Docker daemon; docker-py is imported lazily by
            # them, so it is recognised by module rather than imported here for every admin command.
            if type(exc).__module__.partition(".")[0] == "docker":
                raise Failure(f"docker: {exc}") from None
            raise


@click.group(cls=JobpoolGroup, help=HELP, context_settings={"help_option_names": ["-h", "--help"]})
@_apply(_global_options(group=True))
@click.version_option(package_name="jobpool", message="%(prog)s %(version)s")
@click.pass_context
def cli(ctx: click.Context, redis_url: str | None, pool_name: str | None, as_json: bool) -> None:
    ctx.obj = CliState(redis_url=redis_url, pool_name=pool_name, as_json=as_json)


def load(module: str, name: str, what: str) -> Callable[..., Any]:
    """`module.name`, imported when a command needs it: the worker, supervisor and `up` packages stay out of
    the admin commands' start-up, and a build without one says so in one line."""
    try:
        found: Callable[..., Any] = getattr(importlib.import_module(module), name)
        return found
    except (ImportError, AttributeError) as exc:
        raise Failure(f"{what} is not available in this build ({exc})") from None
