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

A line's `not_before` is epoch seconds (a number, as `Pool.enqueue` takes it) or an ISO-8601 string with its
zone (JSON has no datetime: the string is read as `enqueue --at` reads it, jobpool/cli/durations.py). Its
`after_index` names earlier jobs of the file by their position among its jobs (from 0; blank lines are not
jobs), so a whole pipeline is one file. The file is sent `CHUNK` jobs per `enqueue_many` call, whose own
`after_index` names items of that call: a position in an earlier chunk is sent as that job's id (`after`).
Only the ids of jobs a later chunk names are kept, so memory stays bounded by the references, not the file.
The jobs a line names in `after` must exist: the first pass asks Redis about them `AFTER_CHECK` at a time
(`AfterCheck`), so a line naming a job that does not exist is refused, like any bad line, before anything is
queued.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Callable, Iterator, Sequence
from typing import IO, Any, overload

import click

from .. import errors
from ..spec import MAX_SPEC_BYTES
from ..submit import prepare_item
from .app import BadInput, CliState, Failure
from .durations import parse_moment

#: The longest line read: room for the largest spec written with every character escaped, and far from what
#: memory notices.
MAX_LINE_BYTES = 4 * MAX_SPEC_BYTES
#: The deepest nesting of arrays and objects a line may have; a job's own fields nest two deep (its env).
MAX_DEPTH = 16
#: Jobs per `enqueue_many` call in the second pass: what is held in memory at once.
CHUNK = 10_000
#: The spool stays in memory up to this size, then moves to a temporary file.
SPOOL_IN_MEMORY = 1 << 20
#: How many of the jobs the lines name in `after` the first pass asks Redis about at once.
AFTER_CHECK = 1000
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
    if isinstance(item.get("not_before"), str):  # an ISO-8601 time with its zone; a number is epoch seconds
        try:
            item["not_before"] = parse_moment(item["not_before"]).timestamp()
        except ValueError as exc:
            raise BadInput(f"line {number}: not_before: {exc}") from None
    return item


class Placeholders(Sequence[str]):
    """Stand-ins for the ids of the first `n` jobs of the file, for checking `after_index` in the first pass
    (jobpool/submit.py `check_holds` reads an earlier item's id by its position) without keeping any: one
    distinct id-shaped text per position."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    @overload
    def __getitem__(self, k: int) -> str: ...

    @overload
    def __getitem__(self, k: slice) -> Sequence[str]: ...

    def __getitem__(self, k: int | slice) -> str | Sequence[str]:
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(self.n))]
        if not 0 <= k < self.n:
            raise IndexError(k)
        return f"{k:032x}"


class AfterCheck:
    """The jobs the file's lines name in `after`, checked to exist (`exists`: one bool per id) in batches as
    the first pass goes, never all kept: a job that does not exist makes its line a bad line."""

    def __init__(self, exists: Callable[[list[str]], list[bool]]) -> None:
        self.exists = exists
        self.pending: dict[str, int] = {}  # id -> the first line naming it

    def add(self, number: int, ids: Sequence[str]) -> None:
        for job_id in ids:
            self.pending.setdefault(job_id, number)
        if len(self.pending) >= AFTER_CHECK:
            self.flush()

    def flush(self) -> None:
        """Ask about the pending ids; BadInput naming the first line that names one that does not exist."""
        ids = list(self.pending)
        missing = [job_id for job_id, found in zip(ids, self.exists(ids) if ids else [], strict=True)
                   if not found]
        if missing:
            first = min(missing, key=lambda job_id: self.pending[job_id])
            raise BadInput(f"line {self.pending[first]}: after: job {first} does not exist (never enqueued, "
                           "or finished and pruned)")
        self.pending.clear()


def _refers_back(item: dict[str, Any]) -> list[int]:
    positions = item.get("after_index")
    return list(positions) if isinstance(positions, list) else []


def check(stream: IO[bytes], spool: IO[bytes], coalesce: bool, bind_roots: Sequence[str],
          after: AfterCheck) -> tuple[int, set[int]]:
    """The first pass: every line of `stream` checked and copied to `spool`; returns how many jobs there are,
    and the positions of those a job of a later chunk waits for (`after_index`). A bad line raises BadInput
    naming it."""
    jobs, named = 0, set[int]()
    for number, raw in _lines(stream):
        item = _item(number, raw, coalesce)
        if item is None:
            continue
        try:
            prepare_item(item, bind_roots, jobs, Placeholders(jobs))
        except errors.InvalidSpec as exc:
            raise BadInput(f"line {number}: {exc.reason}") from None
        after.add(number, item.get("after") or ())
        named.update(k for k in _refers_back(item) if k // CHUNK != jobs // CHUNK)
        spool.write(raw if raw.endswith(b"\n") else raw + b"\n")
        jobs += 1
    after.flush()
    return jobs, named


def _in_chunk(item: dict[str, Any], done: int, ids: dict[int, str]) -> dict[str, Any]:
    """`item` of the chunk starting at file position `done`, its `after_index` made the call's own: a position
    in an earlier chunk becomes that job's id (in `after`), one in this chunk its place in the chunk."""
    positions = _refers_back(item)
    if not positions:
        return item
    earlier = [ids[k] for k in positions if k < done]
    here = [k - done for k in positions if k >= done]
    item = {**item, "after_index": here}
    if earlier:
        item["after"] = [*(item.get("after") or []), *earlier]
    return item


def _chunks(spool: IO[bytes], coalesce: bool,
            ids: dict[int, str]) -> Iterator[tuple[list[dict[str, Any]], int]]:
    """The spool's jobs, CHUNK at a time, each chunk with its position in the file's jobs; `ids` holds, by
    the time a chunk is made, the ids of the jobs before it that it waits for."""
    chunk: list[dict[str, Any]] = []
    done = 0
    for number, raw in _lines(spool):
        item = _item(number, raw, coalesce)
        if item is None:  # never: the spool holds only checked jobs
            continue
        chunk.append(_in_chunk(item, done, ids))
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
        pool = state.pool()
        exists = AfterCheck(lambda ids: [s is not None for s in pool.store.job_states(ids)])
        total, named = check(stream, spool, coalesce, tuple(state.settings().bind_roots), exists)
        spool.seek(0)
        twins = 0
        ids: dict[int, str] = {}
        for chunk, done in _chunks(spool, coalesce, ids):
            try:
                jobs = pool.enqueue_many(chunk)
            except errors.JobpoolError as exc:
                if not done and not exc.enqueued:  # nothing queued: the error says all there is
                    raise
                if state.as_json:
                    click.echo("]")
                queued = done + (exc.enqueued or 0)
                raise Failure(f"{exc}; that call held the file's jobs {done + 1} to {done + len(chunk)}: in "
                              f"all the first {queued} of its {total} jobs were enqueued, the ids of the "
                              f"first {done} printed") from None
            twins += sum(j.coalesced for j in jobs)
            ids.update((done + i, j.id) for i, j in enumerate(jobs) if done + i in named)
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
