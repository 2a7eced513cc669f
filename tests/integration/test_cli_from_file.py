"""`jobpool enqueue --from-file`: a JSON-lines file (or stdin) queued in order, against a real redis-server.

Every line is checked before anything is queued: one bad line is one error line naming it, exit 2, and the
keyspace unchanged (tests/support/snapshot.py).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import pytest
import redis
from click.testing import CliRunner, Result

from jobpool import Job, JobState, Pool
from jobpool.cli import jobfile, main
from jobpool.cli.jobfile import MAX_DEPTH, MAX_LINE_BYTES
from tests.support.snapshot import keyspace

POOL = "clifile"
PLUS_TWO = datetime.timezone(datetime.timedelta(hours=2))
SECRET = "hunter2-do-not-print"


@pytest.fixture
def run(redis_url: str) -> Any:
    runner = CliRunner()
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("JOBPOOL_")}
    env.update({"JOBPOOL_REDIS_URL": redis_url, "JOBPOOL_POOL": POOL})

    def invoke(*args: str, stdin: str | None = None) -> Result:
        return runner.invoke(main, list(args), env=env, input=stdin, catch_exceptions=False,
                             prog_name="jobpool")

    return invoke


@pytest.fixture
def pool(redis_url: str) -> Any:
    p = Pool.from_url(redis_url, name=POOL)
    yield p
    p.close()


@pytest.fixture
def seeded(run: Any, pool: Pool) -> Job:
    """Some state (a queued job that others may coalesce into), so "nothing written" means something."""
    assert run("slots", "0").exit_code == 0
    return pool.enqueue("busybox", ["seeded"], env={"TOKEN": SECRET}, coalesce=True)


def lines(*items: Any) -> str:
    return "".join((json.dumps(i) if not isinstance(i, str) else i) + "\n" for i in items)


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "jobs.jsonl"
    path.write_text(text)
    return str(path)


def test_a_file_is_queued_in_order_and_its_ids_printed(run: Any, pool: Pool, seeded: Job,
                                                       tmp_path: Path) -> None:
    text = lines({"image": "busybox", "command": ["echo", "0"], "env": {"TOKEN": SECRET}},
                 "",  # a blank line is skipped
                 {"image": "busybox", "command": ["seeded"], "env": {"TOKEN": SECRET}, "coalesce": True},
                 {"image": "busybox", "command": ["echo", "2"], "workdir": "/w", "labels": {"k": "v"}},
                 {"image": "busybox", "command": ["echo", "3"], "coalesce_key": "nightly", "init": False})
    result = run("enqueue", "--from-file", write(tmp_path, text))
    assert result.exit_code == 0, result.output
    ids = result.stdout.split()
    assert len(ids) == 4 and ids[1] == seeded.id
    assert "coalesced: 1 of the 4 jobs" in result.stderr and SECRET not in result.output
    assert pool.store.client.zrange(pool.keys.queued, 0, -1) == [seeded.id, ids[0], ids[2], ids[3]]
    jobs = [pool.get(i) for i in ids]
    assert [j.spec.command for j in jobs] == [("echo", "0"), ("seeded",), ("echo", "2"), ("echo", "3")]
    assert jobs[0].spec.env == {"TOKEN": SECRET} and jobs[2].spec.workdir == "/w"
    assert jobs[3].coalesce_key == "key:nightly" and jobs[3].spec.init is False


def test_stdin_and_json_output(run: Any, pool: Pool, seeded: Job) -> None:
    text = lines(*({"image": "busybox", "command": ["echo", str(i)], "env": {"TOKEN": SECRET}}
                   for i in range(3)))
    result = run("--json", "enqueue", "--from-file", "-", stdin=text)
    assert result.exit_code == 0, result.output
    docs = json.loads(result.stdout)
    assert [d["spec"]["command"] for d in docs] == [["echo", str(i)] for i in range(3)]
    assert all(d["state"] == "queued" and d["spec"]["env"] == {"TOKEN": "<redacted>"} for d in docs)
    assert SECRET not in result.output
    assert pool.store.client.zrange(pool.keys.queued, 0, -1) == [seeded.id, *(d["id"] for d in docs)]


def test_coalesce_flag_is_every_lines_default(run: Any, pool: Pool, seeded: Job) -> None:
    text = lines({"image": "busybox", "command": ["seeded"], "env": {"TOKEN": SECRET}},
                 {"image": "busybox", "command": ["seeded"], "env": {"TOKEN": SECRET}, "coalesce": False})
    result = run("enqueue", "--coalesce", "--from-file", "-", stdin=text)
    assert result.exit_code == 0, result.output
    first, second = result.stdout.split()
    assert first == seeded.id and second != seeded.id


def test_free_slots_take_the_head_of_the_file(run: Any, pool: Pool) -> None:
    assert run("slots", "2").exit_code == 0
    text = lines(*({"image": "busybox", "command": ["echo", str(i)]} for i in range(3)))
    result = run("--json", "enqueue", "--from-file", "-", stdin=text)
    assert [d["state"] for d in json.loads(result.stdout)] == ["running", "running", "queued"]
    assert pool.get(json.loads(result.stdout)[0]["id"]).state is JobState.RUNNING


@pytest.mark.parametrize("text", ["", "\n\n  \n"])
def test_an_empty_file_queues_nothing_and_says_so(run: Any, raw: redis.Redis, seeded: Job, text: str,
                                                  tmp_path: Path) -> None:
    before = keyspace(raw)
    result = run("enqueue", "--from-file", write(tmp_path, text))
    assert result.exit_code == 0 and result.stdout == ""
    assert result.stderr.strip() == "no jobs in the file: nothing queued"
    assert run("--json", "enqueue", "--from-file", "-", stdin=text).stdout.strip() == "[]"
    assert keyspace(raw) == before


GOOD = {"image": "busybox", "command": ["true"], "env": {"TOKEN": SECRET}}
BAD_LINES = [
    # (the bad line, its message)
    ({"image": "", "command": ["x"]}, "image must be a non-empty string"),
    ({"image": "busybox", "command": ["x"], "privileged": True}, "unknown spec field(s): privileged"),
    ({"image": "busybox", "command": "echo hi"}, "command must be a non-empty list of strings"),
    ({"image": "busybox", "command": ["x"], "env": {"A": 1}}, "env must map strings to strings"),
    ({"image": "busybox", "command": ["x"], "coalesce": "yes"}, "coalesce must be true or false"),
    ({"image": "busybox", "command": ["x"], "mounts": ["/etc:/etc"]}, "is not under an allowed bind root"),
    ('{"image": "busybox", "command": ["x"]', "not JSON"),
    ('["busybox", "true"]', "a JSON list, not an object"),
    ("null", "a JSON NoneType, not an object"),
    # Time and dependencies (line 5 is the file's fourth job: position 3).
    ({**GOOD, "not_before": "2026-12-03T02:00"}, "not_before: '2026-12-03T02:00' names no time zone"),
    ({**GOOD, "not_before": "soon"}, "not_before: 'soon' is not an ISO-8601 time"),
    ({**GOOD, "not_before": True}, "not_before must be a timezone-aware datetime or epoch seconds"),
    ({**GOOD, "after_index": [3]}, "after_index: 3 is not the position of an earlier item (0 to 2)"),
    ({**GOOD, "after_index": [-1]}, "after_index: -1 is not the position of an earlier item"),
    ({**GOOD, "after_index": 0}, "after_index must be a list of earlier items' positions"),
    ({**GOOD, "after_index": [0], "coalesce": True}, "does not coalesce"),
    ({**GOOD, "after": ["a b"]}, "after: 'a b' is not a job id"),
    ({**GOOD, "after": ["0" * 32]}, f"after: job {'0' * 32} does not exist"),
    ({**GOOD, "timeout": 0}, "timeout"),
    ({**GOOD, "retries": 1, "retry_on": [300]}, "retry_on exit code"),
]


@pytest.mark.parametrize(("bad", "message"), BAD_LINES, ids=[m for _, m in BAD_LINES])
def test_a_bad_line_is_one_error_naming_it_and_nothing_is_queued(
        run: Any, raw: redis.Redis, seeded: Job, tmp_path: Path, bad: Any, message: str) -> None:
    # Line 5 is bad (line 3 is blank); 150 good lines after it span two of enqueue_many's batches.
    text = lines(GOOD, GOOD, "", GOOD, bad, *[GOOD] * 150)
    before = keyspace(raw)
    for result in (run("enqueue", "--from-file", write(tmp_path, text)),
                   run("enqueue", "--from-file", "-", stdin=text)):
        assert result.exit_code == 2, result.output
        assert result.stdout == "" and "Traceback" not in result.output and SECRET not in result.output
        assert len(result.stderr.strip().splitlines()) == 1
        assert result.stderr.startswith("Error: line 5: ") and message in result.stderr
    assert keyspace(raw) == before


def test_a_file_that_is_not_utf8_is_refused(run: Any, raw: redis.Redis, seeded: Job, tmp_path: Path) -> None:
    path = tmp_path / "jobs.jsonl"
    path.write_bytes(lines(GOOD).encode() + b'{"image": "\xff", "command": ["x"]}\n')
    before = keyspace(raw)
    result = run("enqueue", "--from-file", str(path))
    assert result.exit_code == 2 and "not UTF-8 text" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert keyspace(raw) == before


@pytest.mark.parametrize("args", [
    ["--from-file", "-", "busybox", "true"],
    ["--env", "A=1", "--from-file", "-"],
    ["--coalesce-key", "k", "--from-file", "-"],
    ["--no-init", "--from-file", "-"],
])
def test_from_file_takes_no_image_command_or_spec_option(run: Any, raw: redis.Redis, seeded: Job,
                                                         args: list[str]) -> None:
    before = keyspace(raw)
    result = run("enqueue", *args, stdin=lines(GOOD))
    assert result.exit_code == 2 and "--from-file takes every job from the file" in result.stderr
    assert keyspace(raw) == before


def test_a_missing_file_is_a_usage_error(run: Any, raw: redis.Redis, seeded: Job, tmp_path: Path) -> None:
    before = keyspace(raw)
    result = run("enqueue", "--from-file", str(tmp_path / "nope.jsonl"))
    assert result.exit_code == 2 and "Invalid value for '--from-file'" in result.stderr
    assert keyspace(raw) == before


def test_without_from_file_image_and_command_are_still_required(run: Any) -> None:
    result = run("enqueue")
    assert result.exit_code == 2 and "Missing argument 'IMAGE'" in result.stderr


# ---- a file as a stream: its nesting, its lines and its length bounded; memory too ------------------------

REPO = Path(__file__).resolve().parents[2]


#: Runs the command of its arguments after the first and writes that child's peak resident memory (KiB, as
#: Linux counts it) to the file named first. The measure needs a small parent: a process made by fork counts
#: its parent's resident pages as its own until it execs, and Linux keeps that peak across the exec.
MEASURE = ("import resource, subprocess, sys\n"
           "rc = subprocess.call(sys.argv[2:])\n"
           "with open(sys.argv[1], 'w') as f:\n"
           "    f.write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))\n"
           "sys.exit(rc)\n")


def run_process(redis_url: str, tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], int]:
    """The CLI as a real process, and its peak resident memory in bytes."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBPOOL_")}
    env.update({"JOBPOOL_REDIS_URL": redis_url, "JOBPOOL_POOL": POOL})
    peak = tmp_path / "peak"
    command = [sys.executable, "-m", "jobpool.cli", *args]
    done = subprocess.run([sys.executable, "-c", MEASURE, str(peak), *command], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=600, check=False)
    return done, int(peak.read_text()) * 1024


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 100_000])
def test_json_nested_too_deep_is_refused_naming_its_line(redis_url: str, raw: redis.Redis, seeded: Job,
                                                         tmp_path: Path, depth: int) -> None:
    # Nested beyond what the JSON decoder's recursion takes, it was a RecursionError traceback and exit 1.
    nested = '{"image": "busybox", "command": ["x"], "env": ' + "[" * depth + "]" * depth + "}"
    text = lines(GOOD, "", nested, GOOD)
    before = keyspace(raw)
    done, _ = run_process(redis_url, tmp_path, "enqueue", "--from-file", write(tmp_path, text))
    assert done.returncode == 2, done.stderr
    assert done.stderr == f"Error: line 3: JSON nested deeper than {MAX_DEPTH} levels\n" and done.stdout == ""
    assert keyspace(raw) == before


def test_brackets_inside_strings_nest_nothing(run: Any, pool: Pool, tmp_path: Path) -> None:
    deep_text = "[" * (MAX_DEPTH * 4) + "{"
    text = lines({"image": "busybox", "command": ["echo", deep_text], "labels": {"k": "]}\\\"[{" * 40}})
    result = run("enqueue", "--from-file", write(tmp_path, text))
    assert result.exit_code == 0, result.output
    assert pool.get(result.stdout.strip()).spec.command == ("echo", deep_text)


def test_a_line_longer_than_any_spec_is_refused_unread(run: Any, raw: redis.Redis, seeded: Job,
                                                       tmp_path: Path) -> None:
    text = lines(GOOD, {"image": "busybox", "command": ["x" * MAX_LINE_BYTES]}, GOOD)
    before = keyspace(raw)
    result = run("enqueue", "--from-file", write(tmp_path, text))
    assert result.exit_code == 2
    assert result.stderr.startswith(f"Error: line 2: longer than {MAX_LINE_BYTES} bytes")
    assert keyspace(raw) == before


def test_a_million_lines_bad_at_the_last_are_refused_in_bounded_memory(redis_url: str, raw: redis.Redis,
                                                                       seeded: Job, tmp_path: Path) -> None:
    # Every line was held (as JSON, then as a spec) before the last was checked: gigabytes for this file.
    path = tmp_path / "big.jsonl"
    with path.open("w") as f:
        f.write(lines(GOOD) * 999_999)
        f.write(lines({"image": "", "command": ["x"]}))
    before = keyspace(raw)
    done, peak = run_process(redis_url, tmp_path, "enqueue", "--from-file", str(path))
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("Error: line 1000000: image must be a non-empty string")
    assert done.stdout == "" and keyspace(raw) == before
    assert peak < 200 * 2**20, f"peak RSS {peak / 2**20:.0f} MiB"


def test_a_file_longer_than_a_chunk_is_queued_whole_in_order(run: Any, pool: Pool, seeded: Job,
                                                             tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jobfile, "CHUNK", 7)
    items: list[dict[str, Any]] = [{"image": "busybox", "command": ["echo", str(i)]} for i in range(20)]
    items[0]["coalesce"] = True
    items[15] = {"image": "busybox", "command": ["seeded"], "env": {"TOKEN": SECRET}, "coalesce": True}
    items[16] = {"image": "busybox", "command": ["echo", "0"], "coalesce": True}  # equals line 1's job
    result = run("--json", "enqueue", "--from-file", write(tmp_path, lines(*items)))
    assert result.exit_code == 0, result.output
    docs = json.loads(result.stdout)
    assert [d["spec"]["command"] for d in docs] == [list(i["command"]) for i in items]
    assert docs[15]["id"] == seeded.id and docs[16]["id"] == docs[0]["id"]
    queued = cast("list[str]", pool.store.client.zrange(pool.keys.queued, 0, -1))
    assert queued == [seeded.id, *(d["id"] for i, d in enumerate(docs) if i not in (15, 16))]
    human = run("enqueue", "--from-file", "-", stdin=lines(*items[:9]))
    ids = human.stdout.split()
    assert human.exit_code == 0 and ids[0] == docs[0]["id"] and len(ids) == 9
    assert "coalesced: 1 of the 9 jobs" in human.stderr


@pytest.mark.parametrize("as_json", [False, True])
def test_redis_full_midway_says_how_much_of_the_file_is_queued(run: Any, pool: Pool, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              as_json: bool) -> None:
    # Redis at its memory limit (noeviction) refuses the chunk that starts past it: the chunks before stand,
    # their ids printed (the JSON array closed), and the one error line counts the file's queued jobs.
    monkeypatch.setattr(jobfile, "CHUNK", 2)
    big = "x" * 60_000
    items = [{"image": "busybox", "command": ["echo", str(i), big, big, big]} for i in range(16)]
    assert run("slots", "0").exit_code == 0
    pool.store.client.config_set("maxmemory-policy", "noeviction")
    used = int(pool.store.client.info("memory")["used_memory"])
    path = write(tmp_path, lines(*items))
    pool.store.client.config_set("maxmemory", str(used + 1_500_000))
    try:
        result = run(*(["--json"] if as_json else []), "enqueue", "--from-file", path)
    finally:
        pool.store.client.config_set("maxmemory", "0")
    queued = cast("list[str]", pool.store.client.zrange(pool.keys.queued, 0, -1))
    assert result.exit_code == 1 and 2 <= len(queued) < len(items), result.output
    printed = [d["id"] for d in json.loads(result.stdout)] if as_json else result.stdout.split()
    assert printed == queued and [pool.get(i).spec.command[1] for i in queued] == [str(i) for i in
                                                                                     range(len(queued))]
    assert len(result.stderr.strip().splitlines()) == 1
    assert f"in all the first {len(queued)} of its {len(items)} jobs were enqueued" in result.stderr


# ---- time and dependencies --------------------------------------------------------------------------------

def test_a_pipeline_in_a_file_waits_in_order_across_chunks(run: Any, pool: Pool, seeded: Job, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """`after_index` names earlier jobs of the file by position, also jobs sent in an earlier chunk (their ids
    go as `after`); `not_before` is epoch seconds or ISO-8601 with its zone; `after` names existing jobs."""
    monkeypatch.setattr(jobfile, "CHUNK", 2)
    now_s = pool.now_ms() // 1000
    items: list[dict[str, Any]] = [
        {**GOOD, "command": ["extract"]},
        {**GOOD, "command": ["transform"], "after_index": [0], "retries": 2, "timeout": 60},
        {**GOOD, "command": ["load"], "after_index": [1, 0], "after": [seeded.id]},  # a chunk after 0 and 1
        {**GOOD, "command": ["at"], "not_before": now_s + 3600},
        {**GOOD, "command": ["iso"],
         "not_before": datetime.datetime.fromtimestamp(now_s + 7200, PLUS_TWO).isoformat()},
    ]
    result = run("--json", "enqueue", "--from-file", write(tmp_path, lines(*items)))
    assert result.exit_code == 0, result.output
    ids = [d["id"] for d in json.loads(result.stdout)]
    jobs = [pool.get(i) for i in ids]
    assert [j.state for j in jobs] == [JobState.QUEUED] + [JobState.WAITING] * 4
    assert jobs[1].after == (ids[0],) and (jobs[1].spec.retries, jobs[1].spec.timeout) == (2, 60)
    assert set(jobs[2].after) == {seeded.id, ids[0], ids[1]}
    assert (jobs[3].wait_until, jobs[3].after) == ((now_s + 3600) * 1000, ())
    assert jobs[4].wait_until == (now_s + 7200) * 1000


def test_a_failure_after_some_jobs_were_queued_is_not_bad_input(run: Any, pool: Pool, seeded: Job,
                                                                 tmp_path: Path, redis_url: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A job `after` names that is gone between the check and its chunk's call (cancelled and pruned by
    retention meanwhile) is refused by the enqueue script, after the jobs before it were queued: exit 1,
    saying how many are, never the exit 2 that means nothing was written."""
    doomed = pool.enqueue("busybox", ["doomed"])
    items = [GOOD] * 150 + [{**GOOD, "after": [doomed.id]}]
    path = write(tmp_path, lines(*items))
    real_check = jobfile.check

    def check_then_prune_it(*args: Any) -> Any:
        found = real_check(*args)
        with contextlib.closing(Pool.from_url(redis_url, name=POOL, keep_cancelled=1)) as pruner:
            pruner.cancel(doomed.id)
            pruner.cancel(pruner.enqueue("busybox", ["newer"]).id)  # the one cancelled job kept
            assert pruner.prune().ids.get("cancelled") == [doomed.id]
        return found

    monkeypatch.setattr(jobfile, "check", check_then_prune_it)
    result = run("enqueue", "--from-file", path)
    assert result.exit_code == 1, result.output
    assert "which does not exist" in result.stderr and "in all the first 100 of its 151 jobs" in result.stderr
    assert len(cast("list[str]", pool.store.client.zrange(pool.keys.queued, 0, -1))) == 1 + 100
