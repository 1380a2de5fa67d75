"""Poison splits on a real Postgres: failed attempts are counted when their checkpoint
commits, the split is quarantined (FAILED) at ``SLUICE_SPLIT_MAX_ATTEMPTS``, shows in
``sluice status`` and goes back with ``sluice retry``; and a continuous run on local Spark
with a truncated gzip, a corrupt Parquet footer and a bad CSV header among good files.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import date, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from conftest import TestSettings
from demo_platform import demo_pipeline, prepare_demo
from landing_oracle import expected_events

from enumerator_service import FencedError, FileSplit, SplitAssignment, SplitStore
from enumerator_service._checkpoint_commit import apply_split_states
from enumerator_service._operations import Platform, discover, open_platform
from enumerator_service._quarantine import quarantined, retry_splits
from spark_jobs.pipeline._paths import discovery_of

MakeSettings = Callable[..., TestSettings]
SLUICE = str(Path(sys.executable).with_name("sluice"))
REASON = {"reason": "truncated compressed stream", "error": "EOFError: ended early"}


@pytest.fixture
def platform(make_settings: MakeSettings) -> Iterator[Platform]:
    p = open_platform(make_settings())
    yield p
    p.close()


def _failed_state(a: SplitAssignment, offset: int, max_attempts: int = 3) -> dict[str, Any]:
    return {
        "id": a.split_id,
        "epoch": a.epoch,
        "offset": offset,
        "watermark": None,
        "finished": True,
        "pending": [],
        "failed": {**REASON, "max_attempts": max_attempts},
    }


def _fail(platform: Platform, run: str, state: dict[str, Any]) -> None:
    with platform.engine.begin() as conn:
        apply_split_states(conn, run, [state], skip_fenced=False)


def _row(platform: Platform, split_id: int) -> dict[str, Any]:
    with platform.engine.connect() as conn:
        row = conn.exec_driver_sql(
            "SELECT status, failures, committed_offset, failure_reason, last_error, run_id,"
            " lease_expires_at FROM sluice.splits WHERE id = %s",
            (split_id,),
        ).one()
    return dict(row._mapping)


def test_a_split_is_quarantined_after_max_attempts_and_retried(platform: Platform) -> None:
    store, source = SplitStore(platform.engine), platform.settings.source_name
    store.register(
        [
            FileSplit(source, "jsonl.gz", "/landing/bad.jsonl.gz", 0, None, date(2026, 1, 1)),
            FileSplit(source, "jsonl", "/landing/good.jsonl", 0, 10, date(2026, 1, 1)),
        ]
    )
    store.assign_to_run("run-1", source, lease_seconds=60)
    first = store.pull_next("run-1", 0, 60)
    assert first is not None and first.split.path.endswith("bad.jsonl.gz")
    _fail(platform, "run-1", _failed_state(first, 120))
    row = _row(platform, first.split_id)
    # Below the limit: back in the run's pool, resuming where the committed output ends.
    assert (row["status"], row["failures"], row["committed_offset"]) == ("ASSIGNED", 1, 120)
    assert row["failure_reason"] == REASON["reason"] and row["run_id"] == "run-1"
    # A later snapshot carrying the same failure again (idempotent: counted once).
    _fail(platform, "run-1", _failed_state(first, 120))
    assert _row(platform, first.split_id)["failures"] == 1
    second = store.pull_next("run-1", 1, 60)
    assert second is not None and second.split_id == first.split_id
    assert second.resume_offset == 120
    _fail(platform, "run-1", _failed_state(second, 120))
    third = store.pull_next("run-1", 0, 60)
    assert third is not None and third.split_id == first.split_id
    _fail(platform, "run-1", _failed_state(third, 120))
    row = _row(platform, first.split_id)
    assert (row["status"], row["failures"], row["lease_expires_at"]) == ("FAILED", 3, None)
    # Quarantined: no run reads it, pool returns and new assignments leave it alone.
    good = store.pull_next("run-1", 0, 60)
    assert good is not None and good.split.path.endswith("good.jsonl")
    assert store.pull_next("run-1", 0, 60) is None
    store.release_run("run-1")
    assert store.assign_to_run("run-2", source, lease_seconds=60) == 1  # the good one only
    assert _row(platform, first.split_id)["status"] == "FAILED"
    (listed,) = quarantined(platform.engine, source)
    assert (listed.id, listed.failures, listed.reason) == (first.split_id, 3, REASON["reason"])
    assert listed.uri == "/landing/bad.jsonl.gz" and listed.last_error == REASON["error"]
    # Retry: unknown or not-failed ids are left alone; the failed one is back, count reset.
    assert retry_splits(platform.engine, [good.split_id, 10**12]) == []
    (back,) = retry_splits(platform.engine, [first.split_id])
    assert back.failures == 3  # (as it was)
    row = _row(platform, first.split_id)
    assert (row["status"], row["failures"], row["committed_offset"]) == ("UNASSIGNED", 0, 120)
    assert quarantined(platform.engine, source) == []


def test_a_stale_attempts_failure_is_fenced(platform: Platform) -> None:
    store, source = SplitStore(platform.engine), platform.settings.source_name
    store.register([FileSplit(source, "csv", "/landing/x.csv", 0, 10, date(2026, 1, 1))])
    store.assign_to_run("run-1", source, lease_seconds=60)
    old = store.pull_next("run-1", 0, 60)
    assert old is not None
    assert store.reclaim("run-1", 0, 60)  # a retried task attempt: new epoch
    with pytest.raises(FencedError):
        _fail(platform, "run-1", _failed_state(old, 0))
    assert _row(platform, old.split_id)["failures"] == 0
    with platform.engine.begin() as conn:  # AT_LEAST_ONCE skips it
        apply_split_states(conn, "run-1", [_failed_state(old, 0)], skip_fenced=True)
    assert _row(platform, old.split_id)["status"] == "READING"


def _cli(args: list[str], db_url: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    env["SLUICE_DATABASE_URL"] = db_url
    env["COLUMNS"] = "400"  # rich: one table row per line
    if (cwd / "poison_pipelines.py").exists():
        env["SLUICE_PIPELINES"] = "poison_pipelines"
    return subprocess.run(
        [SLUICE, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=120
    )


@pytest.mark.extended  # ~35 s: make faults, not CI (quarantine itself is tested above)
def test_status_shows_and_retry_puts_back_failed_splits(
    platform: Platform, db_url: str, tmp_path: Path
) -> None:
    store, source = SplitStore(platform.engine), platform.settings.source_name
    store.register([FileSplit(source, "csv", "/landing/bad.csv", 0, 10, date(2026, 1, 1))])
    store.assign_to_run("run-1", source, lease_seconds=60)
    a = store.pull_next("run-1", 0, 60)
    assert a is not None
    _fail(platform, "run-1", _failed_state(a, 0, max_attempts=1))
    unknown = _cli(["retry", "999999999"], db_url, tmp_path)
    assert unknown.returncode == 2
    assert unknown.stderr.strip().splitlines() == [
        "Error: split 999999999 is not quarantined (no FAILED split has that id)"
    ]
    for bad in (["retry", "--", "-5"], ["retry", "0"], ["retry", str(2**64)], ["retry", "abc"]):
        refused = _cli(bad, db_url, tmp_path)
        assert refused.returncode == 2, refused.stderr
        assert "Invalid value for '[SPLIT]'" in refused.stderr
        assert "Traceback" not in refused.stderr
    neither = _cli(["retry"], db_url, tmp_path)
    assert neither.returncode == 2 and "give either a SPLIT id or --all-failed" in neither.stderr
    both = _cli(["retry", "1", "--all-failed"], db_url, tmp_path)
    assert both.returncode == 2 and "give either a SPLIT id or --all-failed" in both.stderr
    (tmp_path / "poison_pipelines.py").write_text(
        "from spark_jobs import FileSource, Pipeline\n"
        f"p = Pipeline(name={source!r}, source=FileSource(landing={str(tmp_path)!r}, "
        "schema={'x': 'int64'}))\n"
    )
    status = _cli(["status", "--json"], db_url, tmp_path)
    assert status.returncode == 0, status.stderr
    shown = json.loads(status.stdout)["pipelines"][source]
    assert shown["splits"]["FAILED"] == 1
    (failed,) = shown["failed_splits"]
    assert failed["id"] == a.split_id and failed["uri"] == "/landing/bad.csv"
    assert (failed["reason"], failed["failures"]) == (REASON["reason"], 1)
    assert failed["last_error"] == REASON["error"]
    table = _cli(["status"], db_url, tmp_path)
    assert table.returncode == 0, table.stderr
    assert f"failed split {a.split_id}" in table.stdout
    assert "truncated compressed stream after 1 attempts" in table.stdout
    # Scoped to the pipeline: other tests leave quarantined splits of their own in this database.
    done = _cli(["retry", "--all-failed", "--pipeline", source], db_url, tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"split {a.split_id} ({source}) back in")
    assert "/landing/bad.csv — truncated compressed stream after 1 attempts" in lines[0]
    again = _cli(["retry", "--all-failed", "--pipeline", source], db_url, tmp_path)
    assert again.stdout.strip() == "no quarantined splits"
    assert store.counts(source) == {"UNASSIGNED": 1}


# -- a continuous run with poison files among good ones (local Spark) -----------------------

DAY = "2026-01-01"


def _events(prefix: str, n: int) -> list[dict[str, Any]]:
    return [
        {
            "event_id": f"{prefix}-{i}",
            "user_id": i % 50 + 1,
            "event_time": f"{DAY}T00:{i // 60 % 60:02d}:{i % 60:02d}+00:00",
            "event_type": "click",
            "amount": 1.5,
        }
        for i in range(n)
    ]


def _jsonl(rows: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def _parquet(rows: list[dict[str, Any]]) -> pa.Table:
    table = pa.Table.from_pylist(
        [{**r, "event_time": datetime.fromisoformat(r["event_time"])} for r in rows]
    )
    return table.set_column(
        2, "event_time", table.column("event_time").cast(pa.timestamp("us", "UTC"))
    )


def _csv(rows: list[dict[str, Any]], header: str) -> bytes:
    lines = [header] + [
        f"{r['event_id']},{r['user_id']},{r['event_time']},{r['event_type']},{r['amount']}"
        for r in rows
    ]
    return ("\n".join(lines) + "\n").encode()


GZ_ROWS, PQ_ROWS, CSV_ROWS = _events("gz", 3000), _events("pq", 40), _events("csv", 30)
CSV_HEADER = "event_id,user_id,event_time,event_type,amount"


def _land_poison(folder: Path, which: str) -> None:
    """One poison file of issue 13 (``which``: gz, parquet, csv)."""
    if which == "gz":
        whole = gzip.compress(_jsonl(GZ_ROWS))
        (folder / "truncated.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    elif which == "parquet":
        pq.write_table(_parquet(PQ_ROWS), folder / "corrupt.parquet")
        data = (folder / "corrupt.parquet").read_bytes()
        (folder / "corrupt.parquet").write_bytes(data[:-8] + b"\0\0\0\0XXXX")
    else:  # a renamed column: the required user_id is missing
        renamed = CSV_HEADER.replace("user_id", "uid")
        (folder / "bad_header.csv").write_bytes(_csv(CSV_ROWS, renamed))


def _fix_poison(folder: Path) -> None:
    (folder / "truncated.jsonl.gz").write_bytes(gzip.compress(_jsonl(GZ_ROWS)))
    pq.write_table(_parquet(PQ_ROWS), folder / "corrupt.parquet")
    (folder / "bad_header.csv").write_bytes(_csv(CSV_ROWS, CSV_HEADER))


def _output_ids(settings: TestSettings) -> list[str]:
    table = ds.dataset(settings.output_path, format="parquet").to_table(columns=["event_id"])
    return [str(i) for i in table.column("event_id").to_pylist()]


def _wait(condition: Callable[[], bool], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.1)


@pytest.mark.spark
def test_poison_files_in_a_continuous_run_are_quarantined_and_the_rest_is_exactly_once(
    make_settings: MakeSettings, db_url: str, tmp_path: Path
) -> None:
    from spark_jobs.jobs import run_pipeline

    settings = make_settings(
        demo_events=600,
        demo_users=100,
        demo_days=1,
        checkpoint_interval_seconds=0.5,
        continuous_poll_seconds=0.2,
        continuous_idle_seconds=5,
    )
    platform = open_platform(settings)
    try:
        prepare_demo(settings, platform)  # good JSON Lines files and public.users
        pipeline, source = demo_pipeline(settings), settings.source_name
        spec, store = discovery_of(pipeline, settings), SplitStore(platform.engine)
        folder = settings.landing_path / f"dt={DAY}"
        _land_poison(folder, "gz")  # among the files there when the run starts
        discover(platform, spec)
        run_id = "run-poison-continuous"
        fed: dict[str, Any] = {}

        def land_while_running() -> None:
            try:
                _wait(lambda: store.counts(source).get("COMPLETED", 0) > 0)
                # More good files and the other two poison files land; a tick assigns them.
                (folder / "late.jsonl").write_bytes(_jsonl(_events("late", 200)))
                _land_poison(folder, "parquet")
                _land_poison(folder, "csv")
                (folder / "later.jsonl").write_bytes(_jsonl(_events("later", 100)))
                discover(platform, spec)
                fed["assigned"] = store.assign_to_run(
                    run_id, source, lease_seconds=settings.lease_seconds
                )
            except BaseException as exc:  # shown by the main thread
                fed["error"] = exc

        feeder = threading.Thread(target=land_while_running)
        feeder.start()
        try:
            summary = run_pipeline(settings, pipeline, continuous=True, run_id=run_id)
        finally:
            feeder.join(timeout=120)
        assert "error" not in fed, fed["error"]
        assert fed["assigned"] == 4
        # Every poison file is quarantined with its reason; every other split completed.
        failed = {Path(s.uri).name: s for s in quarantined(platform.engine, source)}
        assert {name: (s.reason, s.failures) for name, s in failed.items()} == {
            "truncated.jsonl.gz": ("truncated compressed stream", 3),
            "corrupt.parquet": ("unreadable Parquet file", 3),
            "bad_header.csv": ("bad CSV header", 3),
        }
        assert "header lacks required columns ['user_id']" in failed["bad_header.csv"].last_error
        counts = store.counts(source)
        assert counts["FAILED"] == 3 and set(counts) == {"FAILED", "COMPLETED"}
        # Every good record exactly once; of the truncated gzip, the records before the
        # damage (once each, committed with the failure), nothing of the other two.
        good = {str(e["event_id"]) for e in expected_events(settings.landing_path)[0]}
        ids = _output_ids(settings)
        duplicates = len(ids) - len(set(ids))
        missing = good - set(ids)
        partial = sorted(set(ids) - good, key=lambda i: int(i.split("-")[1]))
        assert (duplicates, len(missing)) == (0, 0)
        assert partial == [f"gz-{i}" for i in range(len(partial))] and len(partial) < 3000
        assert summary.rows_out == len(ids)
        # Fixed, retried: the next run reads them, the gzip from where its output ended.
        _fix_poison(folder)
        retried = _cli(["retry", "--all-failed"], db_url, tmp_path)
        assert retried.returncode == 0, retried.stderr
        # Only this pipeline's lines: other tests leave quarantined splits in this database.
        ours = [line for line in retried.stdout.splitlines() if f"({source})" in line]
        assert len(ours) == 3, retried.stdout
        run_pipeline(settings, pipeline)
        # Each is read as it is now (issue 21): the gzip and the CSV grew in place (appends:
        # the gzip resumes, the CSV's new bytes are a new range); the Parquet file rewritten
        # is a new version, its first one SUPERSEDED.
        assert store.counts(source) == {"COMPLETED": counts["COMPLETED"] + 4, "SUPERSEDED": 1}
        ids = _output_ids(settings)
        everything = good | {str(r["event_id"]) for r in GZ_ROWS + PQ_ROWS + CSV_ROWS}
        assert len(ids) == len(set(ids)) and set(ids) == everything
    finally:
        platform.close()
