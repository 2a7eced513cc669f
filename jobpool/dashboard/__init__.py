"""The live web dashboard: the pool's status, jobs, one job's history and the events feed, refreshed in
place; with JOBPOOL_DASHBOARD_TOKEN set, the CLI's actions too. Read through the pool's public API only
(jobpool/operations.py; docs/architecture.md, "The dashboard").

Starlette and uvicorn are imported here, not by `jobpool` itself: the API and the admin CLI start without
them (`jobpool dashboard` loads this package when it runs).
"""

from .app import create_app
from .server import DEFAULT_HOST, DEFAULT_PORT, run_dashboard

__all__ = ["create_app", "run_dashboard", "DEFAULT_HOST", "DEFAULT_PORT"]
