"""Serving the dashboard: `jobpool dashboard` and `jobpool up` run this (uvicorn, one process)."""

from __future__ import annotations

import ipaddress
import logging

import click
import uvicorn

from .. import httplimits
from ..api import Pool
from ..config import Settings
from .app import create_app

log = logging.getLogger("jobpool.dashboard")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
#: The Host names a browser uses for a dashboard served on loopback.
LOOPBACK_NAMES = ["127.0.0.1", "localhost", "::1", "[::1]"]
#: The most client connections the dashboard holds open (fewer under a low descriptor limit:
#: jobpool/httplimits.py); a browser keeps a few per open tab.
MAX_CONNECTIONS = 512


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def describe(settings: Settings, host: str, port: int) -> list[str]:
    """What the dashboard says when it starts: where, and whether actions are on (never the token)."""
    shown = f"[{host}]" if ":" in host else host
    lines = [f"jobpool dashboard for pool {settings.pool}: http://{shown}:{port}/"]
    if settings.dashboard_token:
        lines.append("  actions on: log in with JOBPOOL_DASHBOARD_TOKEN")
    else:
        lines.append("  read-only: set JOBPOOL_DASHBOARD_TOKEN to enable actions")
    if not is_loopback(host):
        lines.append(f"  WARNING: listening on {host}, not loopback: anyone who reaches this port sees the "
                     "pool (no TLS: put it behind a proxy that adds it)")
    return lines


def run_dashboard(settings: Settings, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> int:
    """Serve the dashboard until SIGINT or SIGTERM."""
    pool = Pool.from_settings(settings)
    pool.actor = "dashboard"
    try:
        for line in describe(settings, host, port):
            click.echo(line, err=line.lstrip().startswith("WARNING"))
        # No access log: the log says what the dashboard did, not every poll of every open page.
        hosts = LOOPBACK_NAMES if is_loopback(host) else None
        # Idle and slow connections closed, open ones capped (jobpool/httplimits.py).
        uvicorn.run(create_app(pool, allowed_hosts=hosts), host=host, port=port, log_level="warning",
                    access_log=False, server_header=False, **httplimits.uvicorn_options(MAX_CONNECTIONS))
    finally:
        pool.close()
    return 0
