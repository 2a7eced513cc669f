"""Fault-injecting proxies put in front of the real servers, for faults a server will not produce on cue.

- `RedisReplyDropper`: a TCP proxy in front of a redis-server that forwards every request, but for chosen
  script calls closes the client's connection instead of passing on the reply: the script ran, the caller
  never heard (a connection reset at the worst moment); or, with `swallow`, instead of passing on the call:
  the caller sent it, the script never ran (a caller stopped on cue just before it).
- `DockerLaunchHold`: a unix-socket proxy in front of a dockerd that holds the reply of
  `POST /containers/create` until released: the daemon has created the container, the caller still waits
  (a daemon hiccup, a big image on vfs); or that holds a container's start request, or a container list
  (a supervisor's sweep held on a slow daemon).

Both pass bytes through untouched otherwise, so the client and the server are the real ones. Nothing here
imports pytest; each proxy runs in threads of the test process and is closed by the test.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _pump(src: socket.socket, on_data: Callable[[bytes], bool]) -> None:
    """Read `src` until it closes, handing each chunk to `on_data`; stop when it returns False."""
    while True:
        try:
            data = src.recv(65536)
        except OSError:
            return
        if not data or not on_data(data):
            return


class _Proxy:
    """Accepts connections on `listener`, opens one upstream connection for each, runs `serve(client,
    upstream)` in a thread per connection. `close()` shuts every socket."""

    def __init__(self, listener: socket.socket, connect: Callable[[], socket.socket]) -> None:
        self._listener = listener
        self._connect = connect
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._closed = False
        self._threads: list[threading.Thread] = []
        self._spawn(self._accept_loop)

    def _spawn(self, target: Callable[..., None], *args: Any) -> None:
        t = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(t)
        t.start()

    def _accept_loop(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = self._connect()
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._closed:
                    client.close()
                    upstream.close()
                    return
                self._sockets += [client, upstream]
            self._spawn(self._serve_safely, client, upstream)

    def _serve_safely(self, client: socket.socket, upstream: socket.socket) -> None:
        try:
            self.serve(client, upstream)
        except OSError:
            pass
        finally:
            self.cut(client, upstream)

    def serve(self, client: socket.socket, upstream: socket.socket) -> None:
        raise NotImplementedError

    def _pump_safely(self, src: socket.socket, on_data: Callable[[bytes], bool],
                     other: socket.socket) -> None:
        """`_pump` in its own thread: when `src` ends, so does the whole connection."""
        try:
            _pump(src, on_data)
        except OSError:
            pass
        finally:
            self.cut(src, other)

    @staticmethod
    def cut(*socks: socket.socket) -> None:
        """Shut both directions now: the peer sees the connection end (reset or EOF)."""
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            socks = [self._listener, *self._sockets]
        self.cut(*socks)
        for s in socks:
            s.close()
        for t in self._threads:
            t.join(5)


# ---- Redis ----------------------------------------------------------------------------------------------


def _resp(buf: bytes, pos: int) -> tuple[Any, int] | None:
    """One RESP2/RESP3 value from `buf` at `pos`: (value, end), or None while it is incomplete. Aggregates
    come back as lists and bulk strings as bytes: enough to count replies and read a request's words."""
    if pos >= len(buf):
        return None
    eol = buf.find(b"\r\n", pos)
    if eol < 0:
        return None
    kind, line, end = buf[pos:pos + 1], buf[pos + 1:eol], eol + 2
    if kind in b"$!=":  # bulk string, bulk error, verbatim string
        n = int(line)
        if n < 0:
            return None, end
        if len(buf) < end + n + 2:
            return None
        return buf[end:end + n], end + n + 2
    if kind in b"*~>%|":  # array, set, push; map and attribute hold pairs
        n = int(line)
        items = []
        for _ in range(max(n, 0) * (2 if kind in b"%|" else 1)):
            got = _resp(buf, end)
            if got is None:
                return None
            item, end = got
            items.append(item)
        return items, end
    if kind in b"+-:_,#(":
        return line, end
    return buf[pos:eol].split(), end  # an inline command (redis-cli style)


class RedisReplyDropper(_Proxy):
    """`url` reaches the redis-server on `upstream_port`. `drop(sha, count)`: the replies of the next
    `count` calls of the script with that SHA1 (EVALSHA, or EVAL of its body) are not passed on; the
    client's connection is closed instead. With `after`, the replies of that many calls pass first; with
    `then`, it is called (in the proxy's thread) once the first dropped reply has come, before the client's
    connection is closed: what happens while the caller still waits. `dropped` and `calls` count them per
    SHA."""

    def __init__(self, upstream_port: int) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        self.port = int(listener.getsockname()[1])
        self._rules: dict[str, list[int]] = {}  # sha: [replies to pass first, replies to drop]
        self._then: dict[str, Callable[[], None]] = {}
        self._swallow: dict[str, Callable[[], None] | None] = {}
        self.dropped: dict[str, int] = {}
        self.calls: dict[str, int] = {}
        super().__init__(listener, lambda: socket.create_connection(("127.0.0.1", upstream_port)))

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def drop(self, sha: str, count: int = 1, after: int = 0, then: Callable[[], None] | None = None) -> None:
        with self._lock:
            self._rules[sha] = [after, count]
            if then is not None:
                self._then[sha] = then

    def swallow(self, sha: str, then: Callable[[], None] | None = None) -> None:
        """The next call of the script with that SHA1 is not passed on: `then` is called (in the proxy's
        thread) while its caller waits for the reply, and the caller's connection is cut. The chunk of bytes
        that ends the call is not passed on either (a client that pipelines loses the requests before it)."""
        with self._lock:
            self._swallow[sha] = then

    def _take_swallow(self, sha: str | None) -> tuple[bool, Callable[[], None] | None]:
        with self._lock:
            if sha is None or sha not in self._swallow:
                return False, None
            return True, self._swallow.pop(sha)

    def _script_sha(self, request: Any) -> str | None:
        if not isinstance(request, list) or len(request) < 2 or not isinstance(request[0], bytes):
            return None
        cmd = request[0].upper()
        if cmd in (b"EVALSHA", b"EVALSHA_RO"):
            return bytes(request[1]).decode(errors="replace").lower()
        if cmd in (b"EVAL", b"EVAL_RO"):
            return hashlib.sha1(bytes(request[1])).hexdigest()
        return None

    def _counted(self, request: Any) -> str | None:
        """The SHA of a script call (counted in `calls`), or None for any other request."""
        sha = self._script_sha(request)
        if sha is not None:
            with self._lock:
                self.calls[sha] = self.calls.get(sha, 0) + 1
        return sha

    def _should_drop(self, sha: str | None, reply: bytes) -> bool:
        """Whether to drop this reply: its script ran (a NOSCRIPT error says it did not: redis-py then loads
        the script and calls again) and drops are left for it."""
        if sha is None or reply.startswith(b"-NOSCRIPT"):
            return False
        with self._lock:
            rule = self._rules.get(sha)
            if rule is None or rule[1] <= 0:
                return False
            if rule[0] > 0:
                rule[0] -= 1
                return False
            rule[1] -= 1
            self.dropped[sha] = self.dropped.get(sha, 0) + 1
            then = self._then.pop(sha, None)
        if then is not None:
            then()
        return True

    def serve(self, client: socket.socket, upstream: socket.socket) -> None:
        # One entry per request, in order: Redis answers in order, so the n-th reply answers the n-th request.
        # A request's entry is queued before its last byte goes upstream, so it is there before its reply.
        pending: deque[str | None] = deque()
        requests = bytearray()

        def upward(data: bytes) -> bool:
            requests.extend(data)
            buf, pos = bytes(requests), 0
            while (got := _resp(buf, pos)) is not None:
                request, pos = got
                sha = self._counted(request)
                swallowed, then = self._take_swallow(sha)
                if swallowed:  # its last byte never goes upstream: Redis never runs it
                    if then is not None:
                        then()
                    self.cut(client, upstream)
                    return False
                pending.append(sha)
            del requests[:pos]
            upstream.sendall(data)
            return True

        self._spawn(self._pump_safely, client, upward, upstream)
        replies = bytearray()

        def downward(data: bytes) -> bool:
            replies.extend(data)
            buf, pos = bytes(replies), 0
            while (got := _resp(buf, pos)) is not None:
                _, end = got
                if self._should_drop(pending.popleft() if pending else None, buf[pos:end]):
                    self.cut(client, upstream)  # the script ran; its caller never hears
                    return False
                client.sendall(buf[pos:end])
                pos = end
            del replies[:pos]
            return True

        _pump(upstream, downward)


# ---- Docker ---------------------------------------------------------------------------------------------


class DockerLaunchHold(_Proxy):
    """A unix socket (`host`, for DOCKER_HOST) in front of the dockerd socket `upstream` (a unix:// URL).

    `hold()`: the reply of every later `POST .../containers/create` is kept back until `release()`. The
    request itself goes through at once, so the daemon creates the container while the caller waits.
    `hold("start")`: every later `POST .../containers/<id>/start` request is kept back until `release()`,
    so the daemon has not started it yet. `hold("list")`: every later `GET .../containers/json` waits until
    `release()`. `refuse(n, message)`: the next `n` creates never reach the daemon and are answered 500 with
    `message`, as a daemon shutting down answers. `held` is set when something is being held, with `held_at`
    its monotonic time; `lists` holds the monotonic time and the target (path and query) of every container
    list request.

    Request lines are recognised at the start of a read: the SDK writes a request's head in one go and sends
    the next request on a connection only after the reply to the previous one, so a read never starts
    inside a request head."""

    def __init__(self, upstream: str) -> None:
        path = upstream.removeprefix("unix://")
        self.dir = Path(tempfile.mkdtemp(prefix="jph-", dir="/tmp"))
        self.path = str(self.dir / "docker.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.path)
        listener.listen(64)
        self._holding: str | None = None
        self._release = threading.Event()
        self.held = threading.Event()
        self.held_at: float | None = None
        self.creates = 0
        self.lists: list[tuple[float, str]] = []
        self._refusals = 0
        self._refusal = ""
        self.refused = 0

        def connect() -> socket.socket:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(path)
            except OSError:
                s.close()
                raise
            return s

        super().__init__(listener, connect)

    @property
    def host(self) -> str:
        return f"unix://{self.path}"

    def hold(self, what: str = "create") -> None:
        assert what in ("create", "start", "list")
        self._release.clear()
        self._holding = what

    def refuse(self, count: int, message: str) -> None:
        with self._lock:
            self._refusals, self._refusal = count, message

    def _take_refusal(self) -> str | None:
        with self._lock:
            if self._refusals <= 0:
                return None
            self._refusals -= 1
            self.refused += 1
            return self._refusal

    @staticmethod
    def _error_reply(message: str) -> bytes:
        body = json.dumps({"message": message}).encode()
        return (b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)

    def release(self) -> None:
        self._holding = None
        self._release.set()

    @staticmethod
    def _request(data: bytes) -> str | None:
        """'create', 'start' or 'list' for those container requests, else None."""
        words = data.split(b"\r\n", 1)[0].split(b" ")
        if len(words) < 2:
            return None
        path = words[1].split(b"?")[0]
        if words[0] == b"GET" and path.endswith(b"/containers/json"):
            return "list"
        if words[0] != b"POST":
            return None
        if path.endswith(b"/containers/create"):
            return "create"
        if path.endswith(b"/start") and b"/containers/" in path:
            return "start"
        return None

    def _hold_here(self) -> None:
        self.held_at = time.monotonic()
        self.held.set()
        self._release.wait(120)

    def serve(self, client: socket.socket, upstream: socket.socket) -> None:
        hold_next = threading.Event()
        # A refused create's body still to read, then its answer.
        swallow: dict[str, Any] = {"left": 0, "reply": b""}

        def upward(data: bytes) -> bool:
            if swallow["left"] > 0:
                swallow["left"] -= len(data)
                if swallow["left"] <= 0:
                    client.sendall(swallow["reply"])
                return True
            request = self._request(data)
            if request == "create" and (message := self._take_refusal()) is not None:
                head, _, body = data.partition(b"\r\n\r\n")
                length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                swallow["left"], swallow["reply"] = length - len(body), self._error_reply(message)
                if swallow["left"] <= 0:
                    client.sendall(swallow["reply"])
                return True
            if request == "create":
                self.creates += 1
            if request == "list":
                self.lists.append((time.monotonic(), data.split(b" ", 2)[1].decode(errors="replace")))
            if request is not None and request == self._holding:
                if request == "create":
                    hold_next.set()  # before the request goes on, so before its reply can come back
                else:
                    self._hold_here()  # the request itself waits: the daemon has not seen it
            upstream.sendall(data)
            return True

        self._spawn(self._pump_safely, client, upward, upstream)

        def downward(data: bytes) -> bool:
            if hold_next.is_set():
                hold_next.clear()
                self._hold_here()
            client.sendall(data)
            return True

        _pump(upstream, downward)

    def close(self) -> None:
        self.release()
        super().close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        with contextlib.suppress(OSError):
            self.dir.rmdir()
