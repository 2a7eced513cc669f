"""Executors: how a job's attempt actually runs (a Docker container, or a child process)."""

from __future__ import annotations

from ...config import Settings
from .base import Executor, Handle, Launch, LaunchError, LaunchUnknown


def make_executor(settings: Settings) -> Executor:
    """The executor the settings name; Docker honours DOCKER_HOST."""
    if settings.executor == "subprocess":
        from .subprocess import SubprocessExecutor

        return SubprocessExecutor(settings.state_dir)
    from .docker import DockerExecutor

    return DockerExecutor()


__all__ = ["Executor", "Handle", "Launch", "LaunchError", "LaunchUnknown", "make_executor"]
