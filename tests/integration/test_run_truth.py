"""The run tells the truth (issue 21): a deterministic error in the pipeline's code stops the
run at once with one line and exit code 5; the summary and exit code name quarantined and
held input; "Nothing new" only when nothing is new. Real Postgres, real Spark (through the
``sluice`` command, as a user sees it)."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest
import sqlalchemy as sa
from cli_env import module_env
from demo_platform import demo_discover, demo_pipeline, prepare_demo

from enumerator_service import FileSplit, SplitAssignment, SplitStore, connect_engine
from enumerator_service._checkpoint_commit import apply_split_states
from enumerator_service._checkpoint_store import COORDINATOR_CHANNEL
from enumerator_service._operations import discover, open_platform, platform_status
from spark_jobs import FileSource, Pipeline
from spark_jobs._outcomes import ExitCode
from spark_jobs.cli._render import left_lines, nothing_line
from spark_jobs.jobs import run_pipeline
from spark_jobs.pipeline._paths import discovery_of

SLUICE = str(Path(sys.executable).with_name("sluice"))

#: A user's module: a Map that returns a string where it declared a double (for x == 37),
#: and records every batch holding that record (one line per attempt that reached it).
BAD_MAP = """
import pyarrow as pa
import pyarrow.compute as pc
from spark_jobs import FileSource, Map, Pipeline

def score(batch):
    if 37 in batch.column("x").to_pylist():
        with open({attempts!r}, "a") as f:
            f.write("attempt\\n")
    text = pc.cast(batch.column("x"), pa.string())
    return batch.append_column("score", pc.if_else(pc.equal(batch.column("x"), 37), "n/a", text))

bad_map = Pipeline(
    name="bad_map",
    source=FileSource(landing={landing!r}, schema={{"x": "int64"}}, partition_by=None),
    steps=[Map(score, output={{"score": "double"}})],
)
"""


def _sluice(
    args: list[str], db_url: str, cwd: Path, **env: str
) -> subprocess.CompletedProcess[str]:
    clean = module_env(db_url, cwd, "truth_pipelines", **env)
    return subprocess.run(
        [SLUICE, *args], env=clean, cwd=cwd, capture_output=True, text=True, timeout=300
    )


def _land(folder: Path, name: str, values: range) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text("".join(json.dumps({"x": x}) + "\n" for x in values))


@pytest.mark.spark
def test_a_map_returning_the_wrong_type_stops_the_run_at_once_with_one_line(
    db_url: str, tmp_path: Path
) -> None:
    landing, attempts = tmp_path / "landing", tmp_path / "attempts.txt"
    _land(landing, "a.jsonl", range(100))  # holds x == 37, at line 38
    _land(landing, "b.jsonl", range(100, 200))
    (tmp_path / "truth_pipelines.py").write_text(
        BAD_MAP.format(landing=str(landing), attempts=str(attempts))
    )
    assert _sluice(["discover", "bad_map"], db_url, tmp_path).returncode == 0
    started = time.monotonic()
    run = _sluice(["run", "bad_map"], db_url, tmp_path)
    seconds = time.monotonic() - started
    # Before: exit 1 after 4 stage attempts and 468 lines of Py4J/Python traceback (44 s).
    assert run.returncode == 5, run.stderr[-3000:]
    assert attempts.read_text().count("attempt") == 1  # one stage attempt, no retries
    assert "Traceback" not in run.stderr and "Py4J" not in run.stderr
    ours = [line for line in run.stderr.splitlines() if line.startswith("sluice")]
    # (Spark's JVM prints its three banner lines first: "Setting default log level", …)
    assert len(run.stderr.strip().splitlines()) <= 4, run.stderr
    (line,) = ours
    assert re.fullmatch(
        r"sluice: run failed: pipeline bad_map: step 1 \(Map score\): field 'score': is "
        r"string, not float64 \(value 'n/a'\): Failed to parse string: 'n/a' as a scalar of "
        rf"type double \(record: split \d+ \({re.escape(str(landing / 'a.jsonl'))}\) "
        r"offset 360\)",
        line,
    ), line
    print(f"deterministic error: exit {run.returncode} after {seconds:.1f} s, 1 attempt")
    # Nothing was committed past it: the bad file's split is back in the pool.
    engine = connect_engine(db_url, pool_size=1)
    try:
        with engine.connect() as conn:
            status = conn.execute(
                sa.text("SELECT status FROM sluice.splits WHERE source = 'bad_map' AND uri = :u"),
                {"u": str(landing / "a.jsonl")},
            ).scalar_one()
    finally:
        engine.dispose()
    assert status == "UNASSIGNED"


#: A pipeline over landing-day folders; its splits are registered by the test itself.
DAYS = """
from spark_jobs import FileSource, Pipeline

days = Pipeline(name={name!r}, source=FileSource(landing={landing!r}, schema={{"x": "int64"}}))
"""


def _fail_split(engine: sa.Engine, a: SplitAssignment, run_id: str) -> None:
    """Quarantine ``a`` as a poison split's failed attempt does (max attempts 1)."""
    state = {
        "id": a.split_id,
        "epoch": a.epoch,
        "offset": 0,
        "watermark": None,
        "finished": True,
        "pending": [],
        "failed": {
            "reason": "truncated compressed stream",
            "error": "EOFError: ended early",
            "max_attempts": 1,
        },
    }
    with engine.begin() as conn:
        apply_split_states(conn, run_id, [state], skip_fenced=False)


def _held_line(count: int, line: str) -> bool:
    """The summary's line for ``count`` splits other-run holds (its lease: 60 s, taken in
    the test a few seconds before)."""
    held = re.fullmatch(
        rf"{count} split\(s\) held by another run \(other-run\): left to it, not read; if that"
        r" run died, its lease ends in (\d+)s and the next run reads them",
        line,
    )
    return held is not None and 0 < int(held.group(1)) <= 60


def test_a_run_names_held_and_quarantined_input_in_its_summary_and_exit_code(
    db_url: str, tmp_path: Path
) -> None:
    name, landing = "truth_days", tmp_path / "landing"
    (tmp_path / "truth_pipelines.py").write_text(DAYS.format(name=name, landing=str(landing)))
    engine = connect_engine(db_url, pool_size=1)
    store, day = SplitStore(engine), date(2026, 1, 1)
    try:
        store.register(
            [
                FileSplit(name, "jsonl", f"{landing}/dt=2026-01-01/{n}.jsonl", 0, 10, day)
                for n in ("held", "bad")
            ]
        )
        # Another live run holds both splits (its lease runs for a minute).
        assert store.assign_to_run("other-run", name, lease_seconds=60) == 2
        held = _sluice(["run", name], db_url, tmp_path)
        # Before: exit 0, "Nothing new to process (truth_days): every discovered split is
        # already committed."
        assert held.returncode == 4, held.stdout + held.stderr
        lines = [line.strip() for line in held.stdout.splitlines() if line.strip()]
        assert lines[0] == f"Nothing to process now ({name}): the new input is held elsewhere."
        assert len(lines) == 2 and _held_line(2, lines[1]), lines
        # One of them turns out to be poison: quarantined (3 wins over 4).
        bad = store.pull_next("other-run", 0, 60)
        assert bad is not None
        _fail_split(engine, bad, "other-run")
        both = _sluice(["run", name], db_url, tmp_path)
        assert both.returncode == 3, both.stdout + both.stderr
        *lines, last = [line.strip() for line in both.stdout.splitlines() if line.strip()]
        assert lines == [
            f"Nothing to process now ({name}): the new input is held elsewhere.",
            "1 quarantined split(s), not in the output (`sluice retry --all-failed` puts them "
            "back):",
            f"split {bad.split_id}: {bad.split.path} — truncated compressed stream after 1 "
            "attempts: EOFError: ended early",
        ]
        assert _held_line(1, last)
        # The other run ends with its split committed: only the quarantined one is left.
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    "UPDATE sluice.splits SET status = 'COMPLETED', lease_expires_at = NULL "
                    "WHERE source = :s AND status <> 'FAILED'"
                ),
                {"s": name},
            )
        quarantined = _sluice(["run", name], db_url, tmp_path)
        assert quarantined.returncode == 3, quarantined.stdout + quarantined.stderr
        first = quarantined.stdout.strip().splitlines()[0]
        assert first == f"Nothing new to process ({name}), but some input is quarantined."
        # Retried and read (marked completed here): truly nothing new.
        with engine.begin() as conn:
            conn.execute(
                sa.text("UPDATE sluice.splits SET status = 'COMPLETED' WHERE source = :s"),
                {"s": name},
            )
        nothing = _sluice(["run", name], db_url, tmp_path)
        assert nothing.returncode == 0, nothing.stdout + nothing.stderr
        assert nothing.stdout.strip() == (
            f"Nothing new to process ({name}): every discovered split is already committed"
            f" (new input is registered by 'sluice discover {name}')."
        )
    finally:
        engine.dispose()


@pytest.mark.spark
def test_status_and_a_replace_count_each_row_once(make_settings: Any) -> None:
    """A replaced day's rows count once in ``status``; the ``--replace`` summary's "removed
    by steps" holds only what steps removed (the clickstream pipeline removes nothing), not
    the other days' records of the files it re-read."""
    settings = make_settings(demo_events=240, demo_users=100, demo_days=2, demo_files_per_day=2)
    platform = open_platform(settings)
    try:
        prepare_demo(settings, platform)
        d1 = settings.demo_start_date
        d2 = d1 + timedelta(days=1)
        # A file landing on d2 with three events of d1: a rebuild of d2 re-reads it.
        at = datetime(d1.year, d1.month, d1.day, 20, tzinfo=UTC)
        cross = [
            {
                "event_id": f"cross-{h}",
                "user_id": 1,
                "event_time": (at + timedelta(hours=h)).isoformat(),
                "event_type": "click",
                "amount": 1.0,
            }
            for h in range(3)
        ]
        folder = Path(settings.landing_path) / f"dt={d2.isoformat()}"
        (folder / "cross.jsonl").write_text("".join(json.dumps(e) + "\n" for e in cross))
        demo_discover(platform)
        pipeline = demo_pipeline(settings)
        first = run_pipeline(settings, pipeline)
        output = ds.dataset(settings.output_path, format="parquet").count_rows()
        assert first.rows_out == output and first.dropped == 0
        replaced = run_pipeline(settings, pipeline, dates=[d2], rebuild=True)
        assert replaced.rebuilt == (d2.isoformat(),)
        status = platform_status(platform, settings.source_name)
        print(
            f"replace: removed by steps {replaced.dropped}, rows in {replaced.rows_in} "
            f"(out {replaced.rows_out}, dead {replaced.dead_letters}); status rows "
            f"{status.rows_committed}, removed {status.rows_dropped}; output {output} rows"
        )
        # Before: the output's rows plus d2's rows again (its first generation), 3 removed.
        assert ds.dataset(settings.output_path, format="parquet").count_rows() == output
        assert (status.rows_committed, status.rows_dropped) == (output, 0)
        # Before: removed by steps 3 (the d1 events of cross.jsonl), rows in 3 too many.
        assert replaced.dropped == 0
        assert replaced.rows_in == replaced.rows_out + replaced.dead_letters
        day_rows = ds.dataset(settings.output_path / f"dt={d2.isoformat()}").count_rows()
        assert replaced.rows_out == day_rows
        assert replaced.other_days == 3
    finally:
        platform.close()


#: A lookup whose key field is a string while the table's key column is a bigint.
KEY_TYPES = """
from spark_jobs import FileSource, Lookup, Pipeline, PostgresSink

good = Pipeline(name="truth_good", source=FileSource(schema={"x": "int64"}, partition_by=None))
orders = Pipeline(
    name="truth_orders",
    source=FileSource(schema={"order_id": "string", "customer": "string"}, partition_by=None),
    steps=[Lookup("public.truth_customers", on={"customer": "id"}, columns={"name": "who"})],
    sink=PostgresSink("public.truth_orders", upsert_key=["order_id"]),
)
"""


def test_pipelines_exits_2_when_it_reports_a_definition_error(db_url: str, tmp_path: Path) -> None:
    (tmp_path / "truth_pipelines.py").write_text(KEY_TYPES)
    engine = connect_engine(db_url, pool_size=1)
    try:
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    "CREATE TABLE IF NOT EXISTS public.truth_customers (id bigint PRIMARY KEY, "
                    "name text)"
                )
            )
    finally:
        engine.dispose()
    result = _sluice(["pipelines"], db_url, tmp_path)
    # Before: exit 0, the error shown as "types of looked-up columns unknown: …".
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Pipeline truth_good" in result.stdout and "Pipeline truth_orders" in result.stdout
    assert (
        "error: pipeline truth_orders: step 1 (Lookup public.truth_customers): key field "
        "'customer' is string but public.truth_customers.id is bigint"
    ) in result.stdout
    assert result.stderr.strip() == "sluice: 1 pipeline definition error(s), shown above"


def _good_and_truncated_gzip(settings: Any, landing: Path) -> Pipeline:
    """A pipeline over ``landing``: 50 good records and a gzip cut in half (a poison split)."""
    _land(landing, "good.jsonl", range(50))
    whole = gzip.compress(b"".join(json.dumps({"x": x}).encode() + b"\n" for x in range(5000)))
    (landing / "bad.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    return Pipeline(
        name=settings.source_name,
        source=FileSource(landing=landing, schema={"x": "int64"}, partition_by=None),
    )


@pytest.mark.spark
def test_a_run_that_quarantines_a_poison_file_says_so_and_exits_3(
    make_settings: Any, tmp_path: Path
) -> None:
    settings = make_settings(split_max_attempts=1)
    landing = tmp_path / "poison"
    pipeline = _good_and_truncated_gzip(settings, landing)
    platform = open_platform(settings)
    try:
        discover(platform, discovery_of(pipeline, settings))
        summary = run_pipeline(settings, pipeline)
        # Before: exit code 0, the run table only ("splits 1"), not a word about the file.
        assert summary.exit_code == ExitCode.QUARANTINED
        lines = left_lines(summary)
        assert lines[0] == (
            "1 quarantined split(s), not in the output (`sluice retry --all-failed` puts them "
            "back):"
        )
        assert re.fullmatch(
            rf"  split \d+: {re.escape(str(landing / 'bad.jsonl.gz'))} — truncated compressed "
            r"stream after 1 attempts: .+",
            lines[1],
        ), lines[1]
        again = run_pipeline(settings, pipeline)
        assert again.nothing_new and again.exit_code == ExitCode.QUARANTINED
        assert nothing_line(again) == (
            f"[bold]Nothing new to process[/] ({settings.source_name}), but some input is "
            "quarantined."
        )
    finally:
        platform.close()


def test_the_coordinator_hears_a_failed_subtask_behind_another_notification(
    make_settings: Any,
) -> None:
    """Two notifications of one transaction arrive in one packet: the coordinator handled
    only the first, so a subtask's deterministic error behind a checkpoint request was lost
    and the run went on to Spark's retries (issue 21)."""
    from spark_jobs.checkpoint import CheckpointCoordinator

    platform = open_platform(make_settings())
    heard: list[str] = []
    run_id = "run-failed-event"
    coordinator = CheckpointCoordinator(
        platform.engine, run_id, 2, {}, interval=0, timeout=10.0, on_stop_request=heard.append
    )
    coordinator.start()
    try:
        time.sleep(0.5)  # listening
        with platform.engine.begin() as conn:
            for event in (
                {"run": run_id, "event": "request", "subtask": 0},
                {"run": run_id, "event": "failed", "subtask": 1, "error": "pipeline p: boom"},
            ):
                conn.execute(sa.select(sa.func.pg_notify(COORDINATOR_CHANNEL, json.dumps(event))))
        deadline = time.monotonic() + 10
        while not heard and time.monotonic() < deadline:
            time.sleep(0.05)
        # Before: nothing heard (the second notification of the packet was dropped).
        assert heard == ["pipeline p: boom"]
        assert coordinator.stop_requested == "pipeline p: boom"
    finally:
        coordinator.stop()
        platform.close()


def test_the_coordinator_hears_its_request_behind_another_runs_notification(
    make_settings: Any,
) -> None:
    """The same packet bug for a checkpoint request: behind another run's notification it
    was dropped, and a coordinator with interval 0 never triggered the checkpoint."""
    from spark_jobs.checkpoint import CheckpointCoordinator

    platform = open_platform(make_settings())
    run_id = "run-request-behind"
    coordinator = CheckpointCoordinator(platform.engine, run_id, 1, {}, interval=0, timeout=10.0)
    coordinator.start()
    try:
        time.sleep(0.5)  # listening
        with platform.engine.begin() as conn:
            for run in ("another-run", run_id):
                event = {"run": run, "event": "request", "subtask": 0}
                conn.execute(sa.select(sa.func.pg_notify(COORDINATOR_CHANNEL, json.dumps(event))))
        deadline, triggered = time.monotonic() + 10, 0
        while not triggered and time.monotonic() < deadline:
            time.sleep(0.1)
            with platform.engine.connect() as conn:
                triggered = conn.execute(
                    sa.text("SELECT count(*) FROM sluice.checkpoints WHERE run_id = :r"),
                    {"r": run_id},
                ).scalar_one()
        assert triggered == 1  # before: 0, the request was lost
    finally:
        coordinator.stop()
        platform.close()


@pytest.mark.spark
def test_a_run_whose_poison_split_failed_one_attempt_says_so_and_exits_4(
    make_settings: Any, tmp_path: Path
) -> None:
    """Below SLUICE_SPLIT_MAX_ATTEMPTS a failed split goes back to the pool: the run that left
    it there did not read it, and says so (found by the new-user trial of issue 21: such runs
    exited 0 and printed nothing about the file)."""
    settings = make_settings(split_max_attempts=2)
    landing = tmp_path / "poison"
    pipeline = _good_and_truncated_gzip(settings, landing)
    platform = open_platform(settings)
    try:
        discover(platform, discovery_of(pipeline, settings))
        summary = run_pipeline(settings, pipeline)
        assert summary.exit_code == ExitCode.HELD, left_lines(summary)
        lines = left_lines(summary)
        assert lines[0].startswith("1 split(s) failed an attempt on their content and are back")
        assert re.fullmatch(
            rf"  split \d+: {re.escape(str(landing / 'bad.jsonl.gz'))} — .+ after 1 attempts: .+",
            lines[1],
        ), lines[1]
        again = run_pipeline(settings, pipeline)  # the second attempt quarantines it
        assert again.exit_code == ExitCode.QUARANTINED and not again.left.retrying
    finally:
        platform.close()
