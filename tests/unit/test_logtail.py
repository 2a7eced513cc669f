"""The stored form of a job's log tail (jobpool/logtail.py): compressed when that pays, read back exactly."""

from __future__ import annotations

import os

from jobpool import logtail


def test_a_text_tail_is_stored_compressed_and_read_back_whole() -> None:
    text = "".join(f"step {i}: processed 1000 records\n" for i in range(2000)).encode()
    stored = logtail.encode(text)
    assert isinstance(stored, str) and stored.startswith(logtail.MARK)
    assert len(stored) * 4 < logtail.LOG_TAIL_BYTES  # 64 KiB of such output takes under 16 KiB
    assert logtail.decode(stored) == text[-logtail.LOG_TAIL_BYTES:].decode()


def test_short_or_incompressible_tails_are_stored_as_they_are() -> None:
    assert logtail.encode(b"hello\n") == b"hello\n"
    noise = os.urandom(4096)
    assert logtail.encode(noise) == noise
    assert logtail.decode("hello\n") == "hello\n" and logtail.decode(None) == logtail.decode("") == ""


def test_a_job_that_prints_the_marker_is_not_mistaken_for_a_packed_tail() -> None:
    printed = (logtail.MARK + "not base85 at all").encode()
    stored = logtail.encode(printed)
    assert logtail.decode(stored if isinstance(stored, str) else stored.decode()) == printed.decode()
    assert logtail.decode(logtail.MARK + "!!") == logtail.MARK + "!!"  # unreadable: shown, never lost
