"""How a job's log tail is stored in its row: the largest part of a finished row that printed anything.

The worker keeps the last `LOG_TAIL_BYTES` of the output. Job output is mostly text and compresses several
times over, and a pool keeps thousands of finished rows (jobpool/retention.py), so a tail worth compressing
is stored zlib-compressed, base85-encoded (the row is read as text by every client), behind a marker no
plain tail starts with. A short tail, or one that does not shrink, is stored as it is; a tail written before
this is read as it was written.
"""

from __future__ import annotations

import base64
import binascii
import zlib

#: How much of the end of a job's output is kept.
LOG_TAIL_BYTES = 64 * 1024
#: A stored tail that starts with this is compressed; a raw tail never does (a NUL byte leads it).
MARK = "\0z85:"
#: Below this, compressing does not pay for its own header.
MIN_COMPRESS = 256


def encode(tail: bytes) -> bytes | str:
    """What the row stores for the last `LOG_TAIL_BYTES` of `tail`."""
    tail = tail[-LOG_TAIL_BYTES:]
    plain_looks_packed = tail.startswith(MARK.encode())  # a job printed the marker: store it packed
    if len(tail) < MIN_COMPRESS and not plain_looks_packed:
        return tail
    packed = MARK + base64.b85encode(zlib.compress(tail, 6)).decode("ascii")
    return packed if len(packed) < len(tail) or plain_looks_packed else tail


def decode(stored: str | None) -> str:
    """The tail as text, from what the row holds (compressed or not)."""
    if not stored:
        return ""
    if not stored.startswith(MARK):
        return stored
    try:
        return zlib.decompress(base64.b85decode(stored[len(MARK):])).decode(errors="replace")
    except (ValueError, binascii.Error, zlib.error):
        return stored  # not ours after all: shown as it is, never lost
