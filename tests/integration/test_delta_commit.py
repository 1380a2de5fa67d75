"""The Delta committer without Spark (real Postgres for the table lock, real delta-rs):
publishing twice commits once, a checkpoint whose commit landed before a crash is not
committed again by recovery, a writer outside Sluice appending meanwhile keeps its rows,
``abort`` deletes only files no commit added."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import date
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from enumerator_service import StagedTransaction, open_location
from enumerator_service._operations import Platform, open_platform
from spark_jobs.connectors.delta import DeltaCommitter, run_app_id
from spark_jobs.connectors.delta._table import ensure_table, table_schema
from spark_jobs.connectors.delta._writer import DeltaSinkWriter

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])
DAY = date(2026, 1, 2)


@pytest.fixture
def platform(make_settings: Any) -> Iterator[Platform]:
    p = open_platform(make_settings())
    yield p
    p.close()


def _stage(
    table: Path,
    run_id: str,
    checkpoint: int,
    ids: range,
    key: list[str] | None = None,
    tag: str = "n",
) -> StagedTransaction:
    """One checkpoint's staged file (written and described by the real writer)."""
    with ThreadPoolExecutor(1) as io:
        writer = DeltaSinkWriter(
            io,
            schema=SCHEMA,
            compression="zstd",
            table=open_location(table),
            meta={"table": str(table), "pipeline": "p", "partition": "dt", "upsert_key": key},
            run_id=run_id,
            subtask=0,
            attempt=f"a{checkpoint}",
        )
        batch = pa.record_batch([pa.array(list(ids)), pa.array([f"{tag}{i}" for i in ids])], SCHEMA)
        writer.write_batch(writer.output_partition(DAY, None), batch)
        out = writer.pre_commit().result()
    return StagedTransaction(checkpoint, run_id, 0, "a", checkpoint, "delta", out.files, out.rows)


def _ids(table: Path) -> list[int]:
    return sorted(DeltaTable(str(table)).to_pyarrow_table().column("id").to_pylist())


def _new_table(tmp_path: Path) -> Path:
    table = tmp_path / "t"
    ensure_table(str(table), {}, table_schema(SCHEMA, "dt"), "dt", "test")
    return table


def test_publishing_twice_commits_once(platform: Platform, tmp_path: Path) -> None:
    table = _new_table(tmp_path)
    committer = DeltaCommitter(platform.engine)
    first = [_stage(table, "r1", 1, range(0, 5))]
    committer.publish(first)
    committer.publish(first)  # recovery after a crash before "marked published"
    second = [_stage(table, "r1", 2, range(5, 9))]
    committer.publish(first + second)  # a recovery handing both: only 2 is new
    delta = DeltaTable(str(table))
    assert _ids(table) == list(range(9))
    assert [h["operation"] for h in delta.history()].count("WRITE") == 2
    assert delta.transaction_version(run_app_id("p", "r1")) == 2
    stats = pa.table(delta.get_add_actions(flatten=True)).to_pylist()
    assert sorted((s["num_records"], s["min.id"], s["max.id"]) for s in stats) == [
        (4, 5, 8),
        (5, 0, 4),
    ]


def test_a_crash_after_the_commit_is_recovered_without_a_second_commit(
    platform: Platform, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = _new_table(tmp_path)
    txns = [_stage(table, "r2", 1, range(3))]
    original = DeltaTable.create_write_transaction

    def commit_then_die(self: DeltaTable, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        raise KeyboardInterrupt("killed between the Delta commit and 'published'")

    monkeypatch.setattr(DeltaTable, "create_write_transaction", commit_then_die)
    with pytest.raises(KeyboardInterrupt):
        DeltaCommitter(platform.engine).publish(txns)
    monkeypatch.undo()
    DeltaCommitter(platform.engine).publish(txns)  # the recovery
    assert _ids(table) == [0, 1, 2]
    assert [h["operation"] for h in DeltaTable(str(table)).history()].count("WRITE") == 1


def test_a_crash_before_the_commit_is_committed_by_recovery(
    platform: Platform, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = _new_table(tmp_path)
    txns = [_stage(table, "r3", 4, range(3))]

    def die(self: DeltaTable, *args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt("killed between the files written and the commit")

    monkeypatch.setattr(DeltaTable, "create_write_transaction", die)
    with pytest.raises(KeyboardInterrupt):
        DeltaCommitter(platform.engine).publish(txns)
    monkeypatch.undo()
    assert _ids(table) == []
    DeltaCommitter(platform.engine).publish(txns)
    assert _ids(table) == [0, 1, 2]


def test_a_concurrent_outside_writer_keeps_its_rows(platform: Platform, tmp_path: Path) -> None:
    table = _new_table(tmp_path)
    outside = pa.table(
        {
            "id": pa.array([1000 + i for i in range(20)], pa.int64()),
            "name": ["x"] * 20,
            "dt": pa.array([DAY] * 20, pa.date32()),
        }
    )

    def other_writer() -> None:
        for i in range(20):
            write_deltalake(str(table), outside.slice(i, 1), mode="append")

    thread = threading.Thread(target=other_writer)
    thread.start()
    committer = DeltaCommitter(platform.engine)
    for checkpoint in range(1, 11):
        committer.publish(
            [_stage(table, "r4", checkpoint, range(checkpoint * 10, checkpoint * 10 + 3))]
        )
    thread.join()
    wanted = sorted(
        [1000 + i for i in range(20)] + [c * 10 + k for c in range(1, 11) for k in range(3)]
    )
    assert _ids(table) == wanted  # duplicates 0, missing 0


def test_abort_deletes_only_uncommitted_files(platform: Platform, tmp_path: Path) -> None:
    table = _new_table(tmp_path)
    committed = [_stage(table, "r5", 1, range(2))]
    DeltaCommitter(platform.engine).publish(committed)
    lost = [_stage(table, "r5", 2, range(2, 4))]
    DeltaCommitter(platform.engine).abort(committed + lost)
    assert Path(committed[0].staged[0]["staged"]).exists()
    assert not Path(lost[0].staged[0]["staged"]).exists()
    assert _ids(table) == [0, 1]


def test_an_upsert_merges_each_checkpoint_once_by_key(platform: Platform, tmp_path: Path) -> None:
    table = _new_table(tmp_path)
    committer = DeltaCommitter(platform.engine)
    first = [_stage(table, "r6", 1, range(0, 4), key=["id"], tag="old")]
    committer.publish(first)
    second = [_stage(table, "r6", 2, range(2, 6), key=["id"], tag="new")]
    committer.publish(second)
    committer.publish(first + second)  # recovery: both already merged
    rows = DeltaTable(str(table)).to_pyarrow_table().sort_by("id").to_pylist()
    assert [(r["id"], r["name"]) for r in rows] == [
        (0, "old0"),
        (1, "old1"),
        (2, "new2"),
        (3, "new3"),
        (4, "new4"),
        (5, "new5"),
    ]
    assert DeltaTable(str(table)).transaction_version(run_app_id("p", "r6")) == 2


def test_an_added_output_field_adds_the_column(platform: Platform, tmp_path: Path) -> None:
    table = _new_table(tmp_path)
    DeltaCommitter(platform.engine).publish([_stage(table, "r7", 1, range(2))])
    wider = SCHEMA.append(pa.field("score", pa.float64()))
    ensure_table(str(table), {}, table_schema(wider, "dt"), "dt", "test")
    fields = DeltaTable(str(table)).schema().to_arrow()
    assert [f.name for f in fields] == ["id", "name", "dt", "score"]
    rows = DeltaTable(str(table)).to_pyarrow_table().to_pylist()
    assert [r["score"] for r in rows] == [None, None]
    ensure_table(str(table), {}, table_schema(wider, "dt"), "dt", "test")  # no change now
    assert DeltaTable(str(table)).version() == 2  # create, append, add column
