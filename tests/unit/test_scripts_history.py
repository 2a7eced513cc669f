"""A job's own history (its row's `history`, scripts/_lib.lua `event`): whole for the life of the job, each
event's free text bounded, and, past HISTORY_MAX_BYTES, its first events and its newest kept with one marker
event between them that says exactly what was dropped. Each runs on fakeredis[lua] and a real redis-server.

The pool's stream keeps every event here (far fewer than its cap), so it is the record each history is
checked against.
"""

from __future__ import annotations

import re
from typing import cast

from jobpool.api import Pool
from jobpool.apichecks import MAX_TEXT_BYTES
from jobpool.contract import (
    EVENT_TEXT_MAX_BYTES,
    HISTORY_HEAD_EVENTS,
    HISTORY_MAX_BYTES,
    REASON_HISTORY_TRIMMED,
)
from tests.support.attempts import claim
from tests.support.pool_helpers import Backend, enqueue, events_of, row

CUT_MARK = re.compile(r"…\((\d+) bytes cut\)\Z")
MARKER_EVIDENCE = re.compile(r"(\d+) events dropped to bound the history \(ids (\S+) to (\S+), "
                             r"at (\d+) to (\d+) ms\)")


def stream_events(pool: Pool, job_id: str) -> list[dict[str, str]]:
    """Every event of `job_id` in the pool's stream, oldest first (filtered from the stream, not the row)."""
    entries = cast("list[tuple[str, dict[str, str]]]", pool.store.client.xrange(pool.keys.events))
    return [{"id": entry_id, **fields} for entry_id, fields in entries if fields.get("job") == job_id]


def pause_and_resume(pool: Pool, job_id: str, times: int, reason: str) -> None:
    for _ in range(times):
        pool.pause(job_id, reason=reason)
        pool.resume(job_id)


def test_five_pauses_with_4_kib_reasons_keep_all_eleven_events(backend: Backend) -> None:
    # The case: the oldest events (`enqueued` first) went without a trace once 16 KiB was reached.
    pool = backend.pool(max_concurrent_jobs=0)
    job = enqueue(pool)
    reason = "r" * MAX_TEXT_BYTES
    pause_and_resume(pool, job.id, 5, reason)
    history = events_of(pool, job.id)
    assert [(e["from"], e["to"], e["reason"], e["evidence"]) for e in history] == [
        ("", "queued", "enqueued", ""),
        *[("queued", "paused", "pause", reason), ("paused", "queued", "resume", "")] * 5]
    assert history == stream_events(pool, job.id)
    tail, _ = pool.tail_events(job.id, 100)
    assert tail == history


def test_a_long_text_is_cut_on_a_character_boundary_with_a_mark(backend: Backend) -> None:
    # The API refuses a reason past MAX_TEXT_BYTES; a worker's own text (a launch error) may be longer.
    assert MAX_TEXT_BYTES <= EVENT_TEXT_MAX_BYTES
    pool = backend.pool()
    job = enqueue(pool)
    reason = "launch_failed: " + "é" * 5000  # two bytes a character, after an odd number of one-byte ones
    evidence = "€" * 3000  # three bytes a character
    claim(pool, job.id).finish("error", reason=reason, evidence=evidence)
    for last in (events_of(pool, job.id)[-1], stream_events(pool, job.id)[-1]):
        said = last["evidence"][:last["evidence"].index("€")]  # finish.lua puts the exit code first
        for whole, kept in ((reason, last["reason"]), (said + evidence, last["evidence"])):
            m = CUT_MARK.search(kept)
            assert m is not None, kept[-40:]
            start = kept[:m.start()]
            assert len(kept.encode()) <= EVENT_TEXT_MAX_BYTES and "\ufffd" not in kept  # whole characters
            assert whole.startswith(start) and len(start.encode()) > EVENT_TEXT_MAX_BYTES - 40
            assert int(m.group(1)) == len(whole.encode()) - len(start.encode())
    # The row keeps the reason whole, and its metric word is that of the reason given.
    assert pool.get(job.id).error_reason == reason
    assert pool.store.client.hget(pool.keys.metrics, "transitions:failed:launch_failed") == "1"


def test_a_text_within_the_budget_is_kept_whole(backend: Backend) -> None:
    pool = backend.pool()
    job = enqueue(pool)
    free = EVENT_TEXT_MAX_BYTES - len("launch_failed: ")
    reason = "launch_failed: " + "x" * (free % 3) + "€" * (free // 3)
    assert len(reason.encode()) == EVENT_TEXT_MAX_BYTES
    claim(pool, job.id).finish("error", reason=reason)
    assert events_of(pool, job.id)[-1]["reason"] == stream_events(pool, job.id)[-1]["reason"] == reason


def test_a_history_past_its_cap_keeps_its_head_its_newest_and_one_marker(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=0)
    job = enqueue(pool)
    pause_and_resume(pool, job.id, 30, "p" * MAX_TEXT_BYTES)
    pool.pause(job.id, reason="the last pause")
    written = stream_events(pool, job.id)
    history = events_of(pool, job.id)
    assert len(row(pool, job.id)["history"].encode()) <= HISTORY_MAX_BYTES

    head, marker, newest = history[:HISTORY_HEAD_EVENTS], history[HISTORY_HEAD_EVENTS], \
        history[HISTORY_HEAD_EVENTS + 1:]
    assert head == written[:HISTORY_HEAD_EVENTS] and head[0]["reason"] == "enqueued"
    assert newest == written[len(written) - len(newest):] and newest[-1]["evidence"] == "the last pause"
    assert [e["reason"] for e in history].count(REASON_HISTORY_TRIMMED) == 1
    dropped = written[HISTORY_HEAD_EVENTS:len(written) - len(newest)]
    assert len(dropped) > 1 and len(newest) > 1
    m = MARKER_EVIDENCE.fullmatch(marker["evidence"])
    assert m is not None, marker["evidence"]
    assert m.groups() == (str(len(dropped)), dropped[0]["id"], dropped[-1]["id"], dropped[0]["at"],
                          dropped[-1]["at"])
    assert (marker["reason"], marker["actor"], marker["job"]) == (REASON_HISTORY_TRIMMED, "jobpool", job.id)
    # It stands where the dropped events stood, and the states still chain through it.
    assert (marker["id"], marker["at"]) == (dropped[-1]["id"], dropped[-1]["at"])
    assert (marker["from"], marker["to"]) == (dropped[0]["from"], dropped[-1]["to"])
    assert [e["to"] for e in history[:-1]] == [e["from"] for e in history[1:]]
    # A reader going on from inside the dropped run is told of it first.
    assert pool.events(job.id, after=dropped[0]["id"])[0] == marker


def test_texts_the_encoder_escapes_are_trimmed_the_same_way(backend: Backend) -> None:
    # A control character takes six bytes in a history line: a few events fill the cap.
    pool = backend.pool()
    job = enqueue(pool)
    text = "\x01" * MAX_TEXT_BYTES
    attempt = claim(pool, job.id)
    pool.pause(job.id, reason=text)
    attempt.finish("exit", 143)
    pool.resume(job.id)
    pause_and_resume(pool, job.id, 3, text)
    history, written = events_of(pool, job.id), stream_events(pool, job.id)
    assert len(row(pool, job.id)["history"].encode()) <= HISTORY_MAX_BYTES
    assert history[:HISTORY_HEAD_EVENTS] == written[:HISTORY_HEAD_EVENTS]
    assert [e["reason"] for e in history[:HISTORY_HEAD_EVENTS]] == ["enqueued", "promoted", "claimed"]
    assert history[HISTORY_HEAD_EVENTS]["reason"] == REASON_HISTORY_TRIMMED
    newest = history[HISTORY_HEAD_EVENTS + 1:]
    assert newest == written[len(written) - len(newest):] and text in [e["evidence"] for e in newest]
