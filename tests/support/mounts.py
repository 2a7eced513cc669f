"""A directory made really read-only for a while: bound onto itself and remounted `ro` (as NFS and CephFS
remount on errors: every write then fails EROFS). Needs root (CAP_SYS_ADMIN); the mount is always undone."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True, text=True)


class ReadOnly:
    """`path` bound onto itself; `read_only()` and `writable()` remount it."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read_only(self) -> None:
        _mount("-o", "remount,ro,bind", str(self.path))

    def writable(self) -> None:
        _mount("-o", "remount,rw,bind", str(self.path))


@contextlib.contextmanager
def bound(path: Path) -> Iterator[ReadOnly]:
    """Bind `path` onto itself (writable at first) for the block; unmounted after it, whatever happens."""
    if os.geteuid() != 0:
        pytest.skip("a read-only bind mount needs root")
    path.mkdir(parents=True, exist_ok=True)
    _mount("--bind", str(path), str(path))
    try:
        yield ReadOnly(path)
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)
