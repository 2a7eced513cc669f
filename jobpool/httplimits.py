"""The limits jobpool's HTTP servers put on their clients' connections: the dashboard
(jobpool/dashboard/server.py) and the supervisor's `/metrics` (jobpool/exporter.py), both served by uvicorn.

uvicorn closes a keep-alive connection `timeout_keep_alive` seconds after a response, but nothing closes a
connection that never sends a request, or sends one a byte at a time; and its `limit_concurrency` answers
503 to requests without refusing connections. So idle sockets could pile up until the process ran out of
descriptors and accepted no one. `LimitedH11Protocol` adds what is missing:

- a request deadline: a connection must deliver a whole request (head and body) within
  REQUEST_TIMEOUT_SECS of being accepted, or of the response before; else it is closed. The time the
  server takes to answer is not counted.
- a cap on open connections, below the process's descriptor limit (`connection_cap`): a connection
  accepted beyond it is closed at once, and the ones already open are served as before.

uvicorn is imported here, not by `jobpool` itself (the workers import the supervisor package, which
imports jobpool/exporter.py; only a server that runs loads this module).
"""

from __future__ import annotations

import asyncio
import resource
from typing import Any, ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

#: How long a connection has to send a whole request, from its accept or from the previous response.
REQUEST_TIMEOUT_SECS = 5.0
#: How long an idle keep-alive connection stays open after a response (uvicorn's `timeout_keep_alive`).
KEEP_ALIVE_SECS = 5
#: The most bytes of a request head read before it is refused with 400 (h11's own bound).
MAX_HEAD_BYTES = 16 * 1024


def connection_cap(ceiling: int) -> int:
    """At most `ceiling` open client connections, and at most half the process's descriptor limit
    (RLIMIT_NOFILE, read when the server starts): the other half stays free for Redis connections (one per
    thread of the dashboard's pool), log files and the interpreter, so accepting never fails for want of a
    descriptor."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return ceiling
    return max(1, min(ceiling, soft // 2))


class LimitedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a request deadline and a cap on open connections (see the module)."""

    max_connections: ClassVar[int] = 1
    request_timeout: ClassVar[float] = REQUEST_TIMEOUT_SECS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.max_connections:
            self.transport = transport  # connection_lost closes it again
            transport.close()
            return
        super().connection_made(transport)
        self._arm_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_deadline()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if not self._waiting_for_client():
            self._cancel_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self._waiting_for_client():
            self._arm_deadline()

    def _waiting_for_client(self) -> bool:
        """True while the next request, or the rest of the current one, is still to come."""
        return self.conn.their_state in (h11.IDLE, h11.SEND_BODY)

    def _arm_deadline(self) -> None:
        self._cancel_deadline()
        self._deadline = self.loop.call_later(self.request_timeout, self._deadline_passed)

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _deadline_passed(self) -> None:
        self._deadline = None
        if self._waiting_for_client() and not self.transport.is_closing():
            self.transport.close()


def uvicorn_options(ceiling: int) -> dict[str, Any]:
    """The `uvicorn.Config` options of a server under these limits, with at most `ceiling` connections."""
    protocol = type("LimitedH11Protocol", (LimitedH11Protocol,), {"max_connections": connection_cap(ceiling)})
    return {"http": protocol, "timeout_keep_alive": KEEP_ALIVE_SECS,
            "h11_max_incomplete_event_size": MAX_HEAD_BYTES}
