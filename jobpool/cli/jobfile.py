"""`enqueue --from-file`: a JSON-lines file (or stdin), every line checked before any job is queued, in
memory bounded whatever the file's length.

All or nothing means the last line must be read before the first job is sent, yet the file may have millions
of lines. So it is read twice, as a stream both times: a first pass checks each line (its size, its nesting,
JSON, the job it describes: jobpool/submit.py `prepare_item`) and keeps nothing of it but its bytes, copied
to a spool (in memory while small, then a temporary file); the second reads the spool, so what is queued is
exactly what was checked even when the input was stdin or the file changed meanwhile, and hands the jobs to
`Pool.enqueue_many` `CHUNK` at a time, printing each chunk's ids (or JSON) as it goes.

A line longer than `MAX_LINE_BYTES` cannot hold a job (a spec is at most spec.MAX_SPEC_BYTES) and is refused
before it is read whole; one nested deeper than `MAX_DEPTH` is refused before the JSON decoder, whose
recursion it could exhaust, sees it.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Iterator, Sequence
from typing import IO, Any

import click

from .. import errors
from ..spec import MAX_SPEC_BYTES
from ..submit import prepare_item
from .app import BadInput, CliState, Failure

#: The longest line read: room for the largest spec written with every character escaped, and far from what
#: memory notices.
MAX_LINE_BYTES = 4 * MAX_SPEC_BYTES
#: The deepest nesting of arrays and objects a line may have; a job's own fields nest two deep (its env).
MAX_DEPTH = 16
#: Jobs per `enqueue_many` call in the second pass: what is held in memory at once.
CHUNK = 10_000
#: The spool stays in memory up to this size, then moves to a temporary file.
SPOOL_IN_MEMORY = 1 << 20
#: A JSON string (skipped whole: a bracket in it nests nothing) or one bracket.
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def _too_deep(text: str) -> bool:
    """Whether `text` nests arrays and objects deeper than MAX_DEPTH. Most lines have too few brackets to
    tell, which two counts show; only a line with more is scanned."""
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return False
    depth = 0
    for m in _TOKEN.finditer(text):
        token = m.group()
        if token in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return True
        elif token in "]}":
            depth -= 1
    return False


def _lines(stream: IO[bytes]) -> Iterator[tuple[int, bytes]]:
    """Each line of `stream` with its number (from 1), none longer than MAX_LINE_BYTES."""
    number = 0
    while raw := stream.readline(MAX_LINE_BYTES + 1):
        number += 1
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            raise BadInput(f"line {number}: longer than {MAX_LINE_BYTES} bytes (a job's spec is at most "
                           f"{MAX_SPEC_BYTES})")
        yield number, raw


def _item(number: int, raw: bytes, coalesce: bool) -> dict[str, Any] | None:
    """The job of one line (None for a blank line), or BadInput naming the line."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadInput(f"line {number}: not UTF-8 text ({exc.reason})") from None
    if not text.strip():
        return None
    if _too_deep(text):
        raise BadInput(f"line {number}: JSON nested deeper than {MAX_DEPTH} levels")
    try:
        item = json.loads(text)
    except ValueError as exc:
        raise BadInput(f"line {number}: not JSON ({exc})") from None
    except RecursionError:  # not reached past _too_deep; kept so no input can end in a traceback
        raise BadInput(f"line {number}: JSON nested deeper than {MAX_DEPTH} levels") from None
    if not isinstance(item, dict):
        raise BadInput(f"line {number}: a JSON {type(item).__name__}, not an object")
    if coalesce:
        item.setdefault("coalesce", True)
    return item


def check(stream: IO[bytes], spool: IO[bytes], coalesce: bool, bind_roots: Sequence[str]) -> int:
    """The first pass: every line of `stream` checked and copied to `spool`; returns how many jobs there are.
    A bad line raises BadInput naming it."""
    jobs = 0
    for number, raw in _lines(stream):
        item = _item(number, raw, coalesce)
        if item is None:
            continue
        try:
            prepare_item(item, bind_roots, jobs)
        except errors.InvalidSpec as exc:
            raise BadInput(f"line {number}: {exc.reason}") from None
        spool.write(raw if raw.endswith(b"\n") else raw + b"\n")
        jobs += 1
    return jobs


def _chunks(spool: IO[bytes], coalesce: bool) -> Iterator[tuple[list[dict[str, Any]], int]]:
    """The spool's jobs, CHUNK at a time, each chunk with its position in the file's jobs."""
    chunk: list[dict[str, Any]] = []
    done = 0
    for number, raw in _lines(spool):
        item = _item(number, raw, coalesce)
        if item is None:  # never: the spool holds only checked jobs
            continue
        chunk.append(item)
        if len(chunk) == CHUNK:
            yield chunk, done
            done += len(chunk)
            chunk = []
    if chunk:
        yield chunk, done


def enqueue_file(state: CliState, stream: IO[bytes], coalesce: bool) -> None:
    """Queue every job of `stream` in order, or none if any line is bad; print their ids (or, with --json,
    one JSON array of them) as they are queued. If Redis fails midway, what was printed is what the earlier
    calls queued (the JSON array closed), and the error says how many of the file's jobs are queued."""
    with tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY) as spool:
        total = check(stream, spool, coalesce, tuple(state.settings().bind_roots))
        spool.seek(0)
        twins = 0
        for chunk, done in _chunks(spool, coalesce):
            try:
                jobs = state.pool().enqueue_many(chunk)
            except errors.JobpoolError as exc:
                if not done:  # nothing printed yet: the error says all there is
                    raise
                if state.as_json:
                    click.echo("]")
                queued = done + (exc.enqueued or 0)
                raise Failure(f"{exc}; that call held the file's jobs {done + 1} to {done + len(chunk)}: in "
                              f"all the first {queued} of its {total} jobs were enqueued, the ids of the "
                              f"first {done} printed") from None
            twins += sum(j.coalesced for j in jobs)
            if state.as_json:
                docs = ", ".join(json.dumps(j.to_dict(), sort_keys=True) for j in jobs)
                click.echo(("[" if not done else ", ") + docs, nl=False)
            else:
                click.echo("\n".join(j.id for j in jobs))
        if state.as_json:
            click.echo("]" if total else "[]")
        elif not total:
            click.echo("no jobs in the file: nothing queued", err=True)
        elif twins:
            click.echo(f"coalesced: {twins} of the {total} jobs equalled a queued job; their ids are printed",
                       err=True)
