"""A container's output as Docker's log endpoint streams it: the frames of its log, a bounded tail of it (the
row's log tail) and the live log's read from a position (`Handle.read_output`, docs/architecture.md "Live
logs"), by Docker's own time stamps. Used by the Docker executor's handle (executors/docker.py).
"""

from __future__ import annotations

import calendar
import struct
import time
from collections.abc import Iterator
from typing import Any

from .base import Output, newest

#: A log stream frame's header: stream type, three zero bytes, a big-endian uint32 length.
_FRAME_HEADER = 8


def read_logs(api: Any, container_id: str, tail: int, max_bytes: int | None = None) -> bytes:
    """The last `tail` lines of a container's stdout and stderr, in the order written, of which only the last
    `max_bytes` are kept (all, with None) as they stream in: a job that printed one 100 MB line without a
    newline is one line to Docker's `tail`, and its log tail costs no more memory than what is kept. Raises
    `requests` errors as the SDK would."""
    out = bytearray()
    for frame in _log_frames(api, container_id, {"tail": tail}, api.timeout):
        out += frame
        if max_bytes is not None and len(out) > 2 * max_bytes:
            del out[:len(out) - max_bytes]
    return bytes(out if max_bytes is None else out[-max_bytes:])


def _log_frames(api: Any, container_id: str, params: dict[str, Any], timeout: float) -> Iterator[bytes]:
    """The frames of a container's log (stdout and stderr, with `params`), each one message as Docker
    logged it. The SDK's `logs` first inspects the container to learn whether it has a TTY, one more daemon
    request per read; jobpool never gives one a TTY, so its log stream is always multiplexed as the Docker
    Engine API documents it ("Stream format"): frames of an 8-byte header (stream type, three zero bytes, a
    big-endian uint32 length) and that many bytes. `timeout` is the request's own, so a thread other than
    the handle's (its live log reader) reads with it while the handle's `_bounded` changes the client's."""
    response = api.get(f"{api.base_url}/v{api.api_version}/containers/{container_id}/logs",
                       params={"stdout": 1, "stderr": 1, **params}, timeout=timeout, stream=True)
    try:
        response.raise_for_status()
        frame, head, left = bytearray(), bytearray(), 0
        for chunk in response.iter_content(1 << 16):
            view, at = memoryview(chunk), 0
            while at < len(view):
                if not left:  # a frame's header, perhaps split across chunks
                    take = min(_FRAME_HEADER - len(head), len(view) - at)
                    head += view[at:at + take]
                    at += take
                    if len(head) == _FRAME_HEADER:
                        left = struct.unpack(">I", head[4:8])[0]
                        head.clear()
                    continue
                take = min(left, len(view) - at)
                frame += view[at:at + take]
                at, left = at + take, left - take
                if not left:
                    yield bytes(frame)
                    frame.clear()
    finally:
        response.close()


def read_output(api: Any, container_id: str, position: str, budget: int, lines: int,
                timeout: float) -> Output:
    """The live log's read of a container's output (`Handle.read_output`). `position` is
    '<nanoseconds>:<count>': the time Docker stamped the last message read, and how many messages with
    that very stamp were read. Bounded whatever the job prints: Docker reads its log back from the end for
    `tail`, so one read costs at most `lines` + 1 messages of the daemon and of this worker; one more than a
    read keeps, so that a message past them proves that lines were skipped.

    Docker takes the `tail` before it filters by `since`, and stamps every piece of a line longer than its
    16 KiB buffer with the line's first time: a window of `lines` + 1 messages all past or at `since`, the
    first stamped `since`, may start inside a run of that stamp, where the count of those read before cannot
    be matched. Then every message of that stamp is taken as read, the read says lines were skipped, and
    the rest of that run is skipped too (count `ALL_OF_STAMP`) until a message of another time comes."""
    since, seen = _position(position)
    params: dict[str, Any] = {"timestamps": 1, "tail": lines + 1}
    if since:
        params["since"] = f"{since // 10**9}.{since % 10**9:09d}"
    window: list[tuple[int, bytes]] = []
    for frame in _log_frames(api, container_id, params, timeout):
        stamp, _, text = frame.partition(b" ")
        at = _nanoseconds(stamp)
        if at is not None and at >= since:
            window.append((at, text))
    unsure = len(window) > lines and window[0][0] == since
    new: list[tuple[int, bytes]] = []
    same = 0  # messages stamped `since` met so far: the first `seen` of them were read before
    for at, text in window:
        if at == since:
            same += 1
            if unsure or same <= seen:
                continue
        new.append((at, text))
    more = len(new) > lines or (unsure and seen < ALL_OF_STAMP)
    if more:
        del new[:max(0, len(new) - lines)]
    if not new:
        return Output(b"", f"{since}:{ALL_OF_STAMP}" if unsure else position, 0, more)
    last = new[-1][0]
    count = ALL_OF_STAMP if unsure and last == since else sum(1 for at, _ in window if at == last)
    text, dropped = newest(b"".join(t for _, t in new), budget)
    return Output(text, f"{last}:{count}", dropped, more)


#: A position's count that skips every message of its stamp (`read_output`).
ALL_OF_STAMP = 10**9


def _position(position: str) -> tuple[int, int]:
    at, _, count = position.partition(":")
    return (int(at), int(count)) if at.isdigit() and count.isdigit() else (0, 0)


def _nanoseconds(stamp: bytes) -> int | None:
    """Docker's RFC 3339 time stamp of a log message (UTC, up to nine digits of fraction) in nanoseconds."""
    try:
        whole, _, fraction = stamp.decode("ascii").rstrip("Z").partition(".")
        seconds = calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S"))
        return seconds * 10**9 + int(fraction[:9].ljust(9, "0") or 0)
    except (UnicodeDecodeError, ValueError):
        return None
