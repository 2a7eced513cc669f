"""Executors: how a job's attempt actually runs (a Docker container, or a child process)."""

from __future__ import annotations

from ...config import Settings
from .base import Executor, Handle, Launch, LaunchError, LaunchUnknown


def make_executor(settings: Settings, daemon_id: str = "", api_version: str | None = None) -> Executor:
    """The executor the settings name; Docker honours DOCKER_HOST. A known `daemon_id` saves a round trip."""
    if settings.executor == "subprocess":
        from .subprocess import SubprocessExecutor

        return SubprocessExecutor(settings.state_dir)
    from .docker import DockerExecutor

    return DockerExecutor(daemon_id=daemon_id, api_version=api_version,
                          checkpoint_root=settings.checkpoint_root)


__all__ = ["Executor", "Handle", "Launch", "LaunchError", "LaunchUnknown", "make_executor"]
