"""The Postgres table sink: output rows commit in the same transaction as the split states.

Real Postgres throughout; the end-to-end tests also run real local Spark.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, date, datetime
from typing import Any

import pyarrow as pa
import pytest
import sqlalchemy as sa
from conftest import TestSettings as Settings
from demo_platform import demo_discover, demo_run, prepare_demo
from landing_oracle import expected_events

from enumerator_service import (
    Acknowledgement,
    CheckpointStore,
    FencedError,
    FileSplit,
    SplitAssignment,
    SplitStore,
    StagedTransaction,
    acknowledge,
    asyncpg_dsn,
    recover,
)
from enumerator_service._checkpoint_store import apply_split_states
from enumerator_service._operations import Platform, open_platform
from enumerator_service._schema import checkpoints, dead_letters, sink_transactions, splits
from spark_jobs.sink import (
    TABLE_SINK_NAME,
    PostgresTableSink,
    PostgresTableSinkWriter,
    StagedOutput,
    build_sinks,
    ensure_tables,
    staged_rows,
    sweep_staged,
)

COLUMNS = (
    "event_id, user_id, event_time, event_type, amount,"
    " user_name, user_country, user_tier, user_signup_time"
)
#: The output of the demo pipeline.
SCHEMA = pa.schema(
    [
        ("event_id", pa.string()),
        ("user_id", pa.int64()),
        ("event_time", pa.timestamp("us", tz="UTC")),
        ("event_type", pa.string()),
        ("amount", pa.float64()),
        ("user_name", pa.string()),
        ("user_country", pa.string()),
        ("user_tier", pa.string()),
        ("user_signup_time", pa.timestamp("us", tz="UTC")),
    ]
)


def _table(settings: Settings) -> str:
    return f"enriched_{settings.source_name}"


@pytest.fixture
def platform(make_settings: Any) -> Iterator[Platform]:
    p = open_platform(make_settings())
    assert isinstance(p.settings, Settings)
    ensure_tables(p.engine, "public", _table(p.settings), SCHEMA, partitioned=True, upsert_key=None)
    yield p
    p.close()


def _count(platform: Platform, table: str) -> int:
    with platform.engine.connect() as conn:
        return int(conn.execute(sa.text(f"SELECT count(*) FROM public.{table}")).scalar_one())


def _counts(platform: Platform) -> tuple[int, int]:
    """(rows visible in the target table, rows in its staged batch tables)."""
    assert isinstance(platform.settings, Settings)
    table = _table(platform.settings)
    with platform.engine.connect() as conn:
        return _count(platform, table), staged_rows(conn, "public", table)


@pytest.mark.spark
@pytest.mark.parametrize("mode", ["EXACTLY_ONCE", "AT_LEAST_ONCE"])
def test_the_table_holds_exactly_the_rows_of_a_direct_sql_join(
    make_settings: Any, mode: str
) -> None:
    settings: Settings = make_settings(checkpointing_mode=mode)
    platform = open_platform(settings)
    table = f"public.{_table(settings)}"
    try:
        prepare_demo(settings, platform)
        found = demo_discover(platform)
        summary = demo_run(settings, table=table)
        expected, malformed = expected_events(settings.landing_path)
        assert malformed > 0, "the sample data must contain malformed lines"
        assert (summary.rows_out, summary.dead_letters) == (len(expected), malformed)
        assert summary.splits == found.splits_registered
        assert not settings.output_path.exists(), "the table sink writes no files"

        with platform.engine.begin() as conn:
            conn.execute(
                sa.text(
                    "CREATE TEMP TABLE expected (event_id text, user_id bigint,"
                    " event_time timestamptz, event_type text, amount double precision, dt text)"
                )
            )
            conn.execute(
                sa.text(
                    "INSERT INTO expected VALUES"
                    " (:event_id, :user_id, :event_time, :event_type, :amount, :dt)"
                ),
                expected,
            )
            joined = conn.execute(
                sa.text(
                    "SELECT e.event_id, e.user_id, e.event_time, e.event_type, e.amount, u.name,"
                    " u.country, u.tier, u.signup_time, CAST(e.dt AS date)"
                    " FROM expected e LEFT JOIN public.users u ON u.id = e.user_id"
                    " ORDER BY e.event_id"
                )
            ).all()
            rows = conn.execute(
                sa.text(f"SELECT {COLUMNS}, dt FROM {table} ORDER BY event_id")
            ).all()
        assert rows == joined
        assert any(r.user_name is None for r in rows), "unknown users must stay (left join)"
        assert _counts(platform) == (len(expected), 0)  # nothing left in staging

        with platform.engine.connect() as conn:
            letters = conn.execute(
                sa.select(sa.func.count()).where(dead_letters.c.source == settings.source_name)
            ).scalar_one()
            kinds = set(
                conn.execute(
                    sa.select(sink_transactions.c.sink).where(
                        sink_transactions.c.run_id == summary.run_id
                    )
                ).scalars()
            )
        assert letters == malformed
        assert kinds == {TABLE_SINK_NAME}
        again = demo_run(settings, table=table)
        assert again.nothing_new
        assert _counts(platform) == (len(expected), 0)
    finally:
        platform.close()


# -- the commit protocol, subtasks played by the test --------------------------------------


def _hold_split(platform: Platform) -> tuple[str, SplitStore, SplitAssignment]:
    """A run holding one pulled split."""
    run_id = f"run-{secrets.token_hex(4)}"
    store = SplitStore(platform.engine)
    source = platform.settings.source_name
    store.register([FileSplit(source, "jsonl", f"/landing/{run_id}.jsonl", 0, 1000, date.today())])
    store.assign_to_run(run_id, source, lease_seconds=60)
    held = store.pull_next(run_id, 0, 60)
    assert held is not None
    return run_id, store, held


def _rows(start: int, stop: int) -> pa.RecordBatch:
    rows = []
    for i in range(start, stop):
        when = datetime(2026, 1, 1, 0, 0, i % 60, tzinfo=UTC)
        rows.append((f"t{i:05d}", i, when, "click", i / 4, f"user{i}", "NL", "gold", when))
    return pa.RecordBatch.from_pylist(
        [dict(zip(SCHEMA.names, r, strict=True)) for r in rows], SCHEMA
    )


def _stage(
    platform: Platform, run_id: str, rows: int, attempt: str = "a1"
) -> tuple[StagedOutput, PostgresTableSinkWriter, ThreadPoolExecutor]:
    """Rows through the task-side writer up to a pre-commit (the writer stays open)."""
    io = ThreadPoolExecutor(1)
    assert isinstance(platform.settings, Settings)
    writer = PostgresTableSinkWriter(
        io,
        dsn=asyncpg_dsn(platform.url),
        schema_name="public",
        table=_table(platform.settings),
        columns=SCHEMA,
        partitioned=True,
        upsert_key=None,
        run_id=run_id,
        subtask=0,
        attempt=attempt,
    )
    for start in range(0, rows, 5000):
        writer.write_batch("2026-01-01", _rows(start, min(rows, start + 5000)))
    return writer.pre_commit().result(timeout=30), writer, io


def _ack(
    platform: Platform, run_id: str, held: SplitAssignment, out: StagedOutput, **kw: Any
) -> None:
    two_phase = kw.pop("two_phase", True)
    state = {
        "id": held.split_id,
        "epoch": kw.pop("epoch", held.epoch),
        "offset": 700,
        "watermark": None,
        "finished": False,
        "pending": [],
    }
    acknowledge(
        platform.engine,
        Acknowledgement(
            run_id=run_id,
            checkpoint_id=1,
            subtask=0,
            attempt="a1",
            final=False,
            snapshot={"splits": [state]},
            sink=TABLE_SINK_NAME,
            staged=out.files,
            row_count=out.rows,
            dead_letters=out.dead_letters,
        ),
        two_phase=two_phase,
        **kw,
    )


def _trigger(platform: Platform, run_id: str) -> None:
    with platform.engine.begin() as conn:
        conn.execute(sa.insert(checkpoints).values(run_id=run_id, checkpoint_id=1))


def _committed_offset(platform: Platform, held: SplitAssignment) -> int | None:
    with platform.engine.connect() as conn:
        return conn.execute(
            sa.select(splits.c.committed_offset).where(splits.c.id == held.split_id)
        ).scalar_one()


def _txns(platform: Platform, run_id: str) -> list[StagedTransaction]:
    with platform.engine.connect() as conn:
        rows = conn.execute(
            sa.select(sink_transactions).where(sink_transactions.c.run_id == run_id)
        ).all()
    return [
        StagedTransaction(
            r.id, r.run_id, r.subtask, r.attempt, r.checkpoint_id, r.sink, r.staged, r.row_count
        )
        for r in rows
    ]


def test_staged_rows_of_a_checkpoint_that_never_completes_are_invisible_then_removed(
    platform: Platform,
) -> None:
    run_id, store, held = _hold_split(platform)
    _trigger(platform, run_id)
    out, writer, io = _stage(platform, run_id, 20_000)  # more than one COPY chunk
    assert (out.rows, [f["batch"] for f in out.files]) == (20_000, [1])
    _ack(platform, run_id, held, out)
    # A second batch is pre-committed but never acknowledged (the task dies before that),
    # and a third is still open (one chunk COPYed, uncommitted) when the task fails.
    writer.write_batch("2026-01-01", _rows(0, 50))
    orphan = writer.pre_commit().result(timeout=30)
    writer.write_batch("2026-01-01", _rows(0, 9000))
    io.submit(lambda: None).result(timeout=30)  # batch 3 is being COPYed
    assert writer.rows_written >= 20_050
    assert _counts(platform) == (0, 20_050)  # durable in staging, invisible in the target
    io.submit(writer.abort).result(timeout=30)  # the open batch rolls back
    io.shutdown()
    assert orphan.rows == 50
    assert _counts(platform) == (0, 20_050)

    # The run dies: recovery aborts its checkpoint and deletes the acknowledged batch; the
    # sweep deletes the batch no transaction recorded.
    store.release_run(run_id)
    _published, aborted = recover(platform.engine, build_sinks(platform.engine))
    assert aborted >= 1  # (other tests' dead runs share the database)
    assert _counts(platform) == (0, 50)
    assert sweep_staged(platform.engine, "public", _table(platform.settings)) == 50
    assert _counts(platform) == (0, 0)
    assert _txns(platform, run_id) == []
    # Idempotent: aborting the same staged output again deletes nothing and fails nothing.
    PostgresTableSink(platform.engine).abort(
        [StagedTransaction(0, run_id, 0, "a1", 1, TABLE_SINK_NAME, out.files, out.rows)]
    )


def test_commit_rolls_back_with_a_failing_completion_transaction(platform: Platform) -> None:
    run_id, store, held = _hold_split(platform)
    _trigger(platform, run_id)
    out, writer, io = _stage(platform, run_id, 300)
    io.submit(writer.close).result(timeout=30)
    io.shutdown()
    _ack(platform, run_id, held, out)
    (txn,) = _txns(platform, run_id)
    sink = PostgresTableSink(platform.engine)
    stale = {
        "id": held.split_id,
        "epoch": held.epoch - 1,
        "offset": 900,
        "watermark": None,
        "finished": False,
        "pending": [],
    }
    visible_inside: list[int] = []

    def completion_fenced_after_the_commit() -> None:
        with platform.engine.begin() as conn:
            sink.commit(conn, [txn])
            table = f"public.{_table(platform.settings)}"  # type: ignore[arg-type]
            visible_inside.append(conn.execute(sa.text(f"SELECT count(*) FROM {table}")).one()[0])
            apply_split_states(conn, run_id, [stale], skip_fenced=False)

    # The rows move inside the transaction; a fenced split state after them rolls it back.
    with pytest.raises(FencedError):
        completion_fenced_after_the_commit()
    assert visible_inside == [300]
    assert _counts(platform) == (0, 300)
    assert _committed_offset(platform, held) is None

    # The completion itself, with an acknowledgement from an attempt that lost the split:
    # FencedError, nothing committed.
    store.reclaim(run_id, 0, 60)  # a retried attempt took the split over (new epoch)
    checkpoint_store = CheckpointStore(platform.engine, run_id, build_sinks(platform.engine))
    with pytest.raises(FencedError):
        checkpoint_store.complete(1, two_phase=True)
    assert _counts(platform) == (0, 300)
    assert [t.id for t in _txns(platform, run_id)] == [txn.id]


def test_completion_commits_rows_and_split_states_together(platform: Platform) -> None:
    run_id, _store, held = _hold_split(platform)
    _trigger(platform, run_id)
    out, writer, io = _stage(platform, run_id, 1000)
    io.submit(writer.close).result(timeout=30)
    io.shutdown()
    _ack(platform, run_id, held, out)
    sinks = build_sinks(platform.engine)
    done = CheckpointStore(platform.engine, run_id, sinks).complete(1, two_phase=True)
    assert done is not None and done.rows == 1000
    assert _counts(platform) == (1000, 0)
    assert _committed_offset(platform, held) == 700
    with platform.engine.connect() as conn:
        dt, same_time = conn.execute(
            sa.text(
                "SELECT DISTINCT dt, user_signup_time = event_time"
                f" FROM public.{_table(platform.settings)}"  # type: ignore[arg-type]
            )
        ).one()
    assert (dt, same_time) == (date(2026, 1, 1), True)
    # Staged rows that disappeared are a loss, not a silent empty commit.
    with pytest.raises(RuntimeError, match="staged output is lost"), platform.engine.begin() as c:
        sinks[TABLE_SINK_NAME].commit(c, _txns(platform, run_id))


def test_at_least_once_rows_become_visible_with_the_subtasks_split_states(
    platform: Platform,
) -> None:
    run_id, _store, held = _hold_split(platform)
    _trigger(platform, run_id)
    out, writer, io = _stage(platform, run_id, 500)
    io.submit(writer.close).result(timeout=30)
    io.shutdown()
    _ack(platform, run_id, held, out, two_phase=False, sink=PostgresTableSink())
    assert _counts(platform) == (500, 0)
    assert _committed_offset(platform, held) == 700
    assert [(t.row_count,) for t in _txns(platform, run_id)] == [(500,)]


@pytest.mark.spark
def test_an_upsert_sink_replaces_a_re_materialised_day_by_key(make_settings: Any) -> None:
    """Re-processing a processed day writes its rows again: with an upsert key they replace
    the previous ones (a changed dimension row shows), the table never holds a key twice, and
    the day's rows of other days are untouched."""
    settings: Settings = make_settings()
    platform = open_platform(settings)
    table = f"public.{_table(settings)}"
    day = settings.demo_start_date
    try:
        prepare_demo(settings, platform)
        demo_discover(platform)
        first = demo_run(settings, table=table, upsert=True)
        with platform.engine.begin() as conn:
            conn.execute(sa.text("UPDATE public.users SET name = name || '*' WHERE id % 7 = 0"))
            before = dict(
                conn.execute(sa.text(f"SELECT dt, count(*) FROM {table} GROUP BY dt")).all()
            )
        again = demo_run(settings, table=table, upsert=True, dates=[day], rebuild=True)
        assert again.rebuilt == (day.isoformat(),)
        assert again.rows_out == before[day]
        with platform.engine.connect() as conn:
            after = dict(
                conn.execute(sa.text(f"SELECT dt, count(*) FROM {table} GROUP BY dt")).all()
            )
            renamed = dict(
                conn.execute(
                    sa.text(
                        f"SELECT t.dt, count(*) FILTER (WHERE t.user_name LIKE '%*') FROM {table} t"
                        " WHERE t.user_id % 7 = 0 GROUP BY t.dt"
                    )
                ).all()
            )
            keys = conn.execute(
                sa.text(f"SELECT count(DISTINCT event_id) FROM {table}")
            ).scalar_one()
        assert after == before and keys == sum(before.values()) == first.rows_out
        assert renamed[day] > 0  # the day was written again, with the changed names
        assert all(renamed[d] == 0 for d in renamed if d != day)  # the others were not
    finally:
        platform.close()
