"""Delta sink runs under faults (real Postgres, real local Spark, real delta-rs): an
incremental second run; a crash between the files written and the Delta commit, and one
between the commit and "marked published", each followed by the recovery of the next run;
another process appending to the table during a run. After each: the table read by delta-rs and
by DuckDB over the log's current files equals the landing oracle plus the outside rows
(duplicates 0, missing 0), and the Dagster accounting (committed rows = rows present per
day, no duplicate keys) agrees."""

from __future__ import annotations

import dataclasses
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import orjson
import pytest
from conftest import TestSettings as Settings
from deltalake import DeltaTable
from demo_platform import demo_discover, demo_pipeline, prepare_demo
from foreign_writer import BATCH, committed_ids, delta_commits, foreign_writer
from landing_oracle import expected_events

from enumerator_service._operations import open_platform
from spark_jobs import DeltaSink, Pipeline
from spark_jobs.connectors import sink_connector
from spark_jobs.connectors.delta import DeltaCommitter, run_app_id
from spark_jobs.connectors.delta._commit import RUN_ID
from spark_jobs.jobs import run_pipeline

pytestmark = pytest.mark.spark


class Injected(RuntimeError):
    """The fault a test injects into the committer."""


def _setup(
    make_settings: Any, tmp_path: Path, events: int = 200, **overrides: Any
) -> tuple[Settings, Pipeline]:
    settings: Settings = make_settings(
        demo_events=events, demo_days=2, demo_files_per_day=2, **overrides
    )
    platform = open_platform(settings)
    prepare_demo(settings, platform)
    demo_discover(platform)
    platform.close()
    sink = DeltaSink(str(tmp_path / "lake" / "events"))
    return settings, dataclasses.replace(demo_pipeline(settings), sink=sink)


def _table(pipeline: Pipeline) -> str:
    return str(pipeline.sink.path)  # type: ignore[attr-defined]


def _assert_exact(
    settings: Settings, pipeline: Pipeline, extra: Counter[str] | None = None
) -> None:
    oracle, _bad = expected_events(Path(settings.landing_path))
    wanted = Counter(str(r["event_id"]) for r in oracle) + (extra or Counter())
    delta = DeltaTable(_table(pipeline))
    by_delta = Counter(delta.to_pyarrow_table(columns=["event_id"]).column(0).to_pylist())
    files = ", ".join(f"'{uri}'" for uri in delta.file_uris())
    by_duckdb = Counter(
        row[0] for row in duckdb.sql(f"SELECT event_id FROM read_parquet([{files}])").fetchall()
    )
    for got in (by_delta, by_duckdb):
        assert sum((got - wanted).values()) == 0, "duplicates"
        assert sum((wanted - got).values()) == 0, "missing"
    # App transaction versions of every commit only grow.
    versions: dict[str, list[int]] = {}
    for app, version in _app_transactions(pipeline):
        versions.setdefault(app, []).append(version)
    assert versions
    for app, seen in versions.items():
        assert seen == sorted(set(seen)), (app, seen)  # strictly increasing
    if not extra:
        _assert_accounting(settings, pipeline)


def _assert_accounting(settings: Settings, pipeline: Pipeline) -> None:
    connector = sink_connector(pipeline.sink)
    assert connector is not None
    platform = open_platform(settings)
    try:
        days = [settings.demo_start_date + timedelta(days=n) for n in range(3)]
        with platform.engine.connect() as conn:
            committed = connector.committed_rows(conn, pipeline, settings, days)
            present = connector.rows_out(conn, pipeline, settings, days)
        assert {d: n for d, n in present.items() if n} == committed
        for day in days:
            assert connector.duplicate_keys(pipeline, settings, day, ["event_id"])[0] == 0
    finally:
        platform.close()


def test_an_incremental_second_run_adds_only_the_new_file(
    make_settings: Any, tmp_path: Path
) -> None:
    settings, pipeline = _setup(make_settings, tmp_path)
    run_pipeline(settings, pipeline)
    first = DeltaTable(_table(pipeline)).version()
    day = settings.demo_start_date + timedelta(days=1)
    at = datetime(day.year, day.month, day.day, 12, tzinfo=UTC)
    lines = [
        orjson.dumps(
            {
                "event_id": f"late-{i}",
                "user_id": 1,
                "event_time": (at + timedelta(minutes=i)).isoformat(),
                "event_type": "click",
                "amount": 2.5,
            }
        )
        for i in range(7)
    ]
    folder = Path(settings.landing_path) / f"dt={day.isoformat()}"
    (folder / "extra.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    platform = open_platform(settings)
    demo_discover(platform)
    platform.close()
    summary = run_pipeline(settings, pipeline)
    assert summary.rows_out == 7
    delta = DeltaTable(_table(pipeline))
    assert delta.version() > first
    _assert_exact(settings, pipeline)


@pytest.mark.parametrize("when", ["before the commit", "after the commit"])
def test_a_crash_around_the_delta_commit_is_recovered_exactly(
    make_settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    settings, pipeline = _setup(make_settings, tmp_path)
    original = DeltaTable.create_write_transaction

    def faulty(self: DeltaTable, *args: Any, **kwargs: Any) -> None:
        if when == "after the commit":
            original(self, *args, **kwargs)
        raise Injected(f"killed {when}")

    monkeypatch.setattr(DeltaTable, "create_write_transaction", faulty)
    with pytest.raises(Exception) as caught:  # noqa: PT011 - whatever wraps the fault
        run_pipeline(settings, pipeline)
    assert f"killed {when}" in _chain(caught.value)
    monkeypatch.undo()
    commits_before = len(DeltaTable(_table(pipeline)).history())
    run_pipeline(settings, pipeline)  # its recovery publishes the committed checkpoint
    history = DeltaTable(_table(pipeline)).history()
    if when == "before the commit":  # the recovery made the commit the crash prevented
        assert len(history) > commits_before
    # (after the commit: whether the first run got further depends on timing; exactness and
    # strictly increasing app transaction versions below say nothing was committed twice)
    _assert_exact(settings, pipeline)


def _chain(exc: BaseException | None) -> str:
    text: list[str] = []
    seen: set[int] = set()
    while exc is not None:
        assert id(exc) not in seen, f"a cycle in the exception chain: {' <- '.join(text)}"
        seen.add(id(exc))
        text.append(f"{type(exc).__name__}: {exc}")
        exc = exc.__cause__ or exc.__context__
    return " <- ".join(text)


def test_another_process_appending_during_a_run_keeps_both_writers_rows_exactly_once(
    make_settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 24's acceptance for Delta: another OS process (delta-rs' own
    ``write_deltalake(mode="append")``, its own retry) appends to the table in a loop while a
    run commits checkpoint after checkpoint; one of its commits is forced between the run's
    first table load and commit. Both writers' rows end up exactly once, each of the run's
    app transaction versions is in the log once."""
    # One subtask reading small blocks slowly (one lookup of 150 ms at a time) and frequent
    # checkpoints: the run commits many versions over seconds, the other process between.
    settings, pipeline = _setup(
        make_settings,
        tmp_path,
        events=3000,
        target_split_bytes=64 << 10,
        read_block_bytes=16 << 10,
        lookup_capacity=1,
        lookup_injected_latency_ms=150,
        parallelism=1,
        checkpoint_interval_seconds=0.2,
    )
    loaded: list[int] = []
    raced: list[dict[str, Any]] = []
    real_commit = DeltaTable.create_write_transaction
    # (0.5 s between its commits: one committing back to back on a loaded machine can make
    # all of the run's bounded commit retries conflict)
    folder, table = tmp_path / "foreign", _table(pipeline)
    with foreign_writer(folder, format="delta", table=table, pause=0.5) as writer:

        def racing_commit(self: DeltaTable, *args: Any, **kwargs: Any) -> None:
            # The run's first commit: the other process commits after this load.
            if not loaded:
                loaded.append(self.version())
                raced.append(writer.race())
            real_commit(self, *args, **kwargs)

        monkeypatch.setattr(DeltaTable, "create_write_transaction", racing_commit)
        summary = run_pipeline(settings, pipeline)
        commits = writer.stop()
    # Both writers' rows exactly once (delta-rs and DuckDB), app versions strictly growing.
    _assert_exact(settings, pipeline, extra=committed_ids(commits))
    app = run_app_id(pipeline.name, summary.run_id)
    txns = Counter(_app_transactions(pipeline))
    assert txns and {a for a, _v in txns} == {app}
    assert max(txns.values()) == 1, txns  # each checkpoint's version in the log once
    # The log's foreign commits are exactly the commits the process reports.
    log = delta_commits(_table(pipeline))
    foreign = {int(info[BATCH]): version for version, info in log if BATCH in info}
    assert foreign == {c["batch"]: c["commit"] for c in commits}
    # The forced race: the run's first commit came after the raced one, on a later version
    # than the one it loaded.
    ours = [(v, info["timestamp"]) for v, info in log if info.get(RUN_ID) == summary.run_id]
    assert loaded[0] < raced[0]["commit"] < ours[0][0]
    # The other process committed during the run, between the run's first and last commit.
    during = [c for c in commits if ours[0][1] < c["at_ms"] < ours[-1][1]]
    assert len(during) >= 2, (len(ours), len(commits), len(during))


def _app_transactions(pipeline: Pipeline) -> list[tuple[str, int]]:
    """(app id, version) of every app transaction in the table's log, oldest first."""
    found = []
    for path in sorted(Path(_table(pipeline), "_delta_log").glob("*.json")):
        for line in path.read_bytes().splitlines():
            txn = orjson.loads(line).get("txn")
            if txn:
                found.append((txn["appId"], txn["version"]))
    return found


def test_the_committer_is_what_publishes(make_settings: Any, tmp_path: Path) -> None:
    """(The faults above are injected into delta-rs under this committer.)"""
    _settings, pipeline = _setup(make_settings, tmp_path, events=10)
    connector = sink_connector(pipeline.sink)
    assert connector is not None
    assert isinstance(connector.committers(None)["delta"], DeltaCommitter)
