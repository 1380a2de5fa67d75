"""An upsert sink's commit by ``MERGE`` (Postgres 15+) against ``INSERT … ON CONFLICT`` and a
Python oracle: the same table after the same staged batches, for a change stream (deletes),
an upsert by event time and a plain upsert; and a key another transaction inserts meanwhile
(``MERGE`` fails on it) falls back to ``ON CONFLICT`` without losing a row."""

from __future__ import annotations

import random
import secrets
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa
import pytest
import sqlalchemy as sa

from enumerator_service import StagedTransaction, asyncpg_dsn
from enumerator_service._operations import Platform, open_platform
from spark_jobs.sink import (
    TABLE_SINK_NAME,
    PostgresTableSink,
    PostgresTableSinkWriter,
    _table_commit,
    _table_merge,
    ensure_tables,
    staged_rows,
    sweep_staged,
)

SCHEMA = pa.schema(
    [("id", pa.int64()), ("v", pa.string()), ("_op", pa.string()), ("_lsn", pa.int64())]
)
LAYOUTS = {  # (latest_by, op_field)
    "change stream": ("_lsn", "_op"),
    "latest event": ("_lsn", None),
    "last staged": (None, None),
}


@pytest.fixture
def platform(make_settings: Any) -> Iterator[Platform]:
    p = open_platform(make_settings())
    yield p
    p.close()


def _stream(rng: random.Random, n: int, first_lsn: int) -> list[dict[str, Any]]:
    """``n`` changes of 60 keys: ops c/u/d, event times mostly rising, some late, some null."""
    rows = []
    for i in range(n):
        lsn = None if rng.random() < 0.03 else first_lsn + i - rng.choice([0, 0, 0, 40])
        rows.append({"id": rng.randrange(60), "v": f"v{i}", "_op": rng.choice("cuud"), "_lsn": lsn})
    return rows


def _oracle(
    stored: dict[int, dict[str, Any]],
    batches: list[list[dict[str, Any]]],
    latest: str | None,
    op: str | None,
) -> dict[int, dict[str, Any]]:
    def rank(item: tuple[int, int, dict[str, Any]]) -> tuple[Any, ...]:
        batch, seq, row = item
        t = row[latest] if latest else None
        return (t is not None, t if t is not None else 0, batch, seq)

    winners: dict[int, tuple[int, int, dict[str, Any]]] = {}
    for b, rows in enumerate(batches):
        for s, row in enumerate(rows):
            item = (b, s, row)
            if row["id"] not in winners or rank(item) > rank(winners[row["id"]]):
                winners[row["id"]] = item
    out = dict(stored)
    for key, (_, _, row) in winners.items():
        old = out.get(key)
        stored_at = old.get(latest) if old is not None and latest else None
        if stored_at is not None and (row[str(latest)] is None or stored_at > row[str(latest)]):
            continue  # the stored row is of a later event
        if op and row[op] == "d":
            out.pop(key, None)
        else:
            out[key] = row
    return out


def _writer(
    platform: Platform,
    table: str,
    layout: tuple[str | None, str | None],
    upsert_key: tuple[str, ...] | None = ("id",),
) -> tuple[ThreadPoolExecutor, str, PostgresTableSinkWriter]:
    """(its I/O thread, the run id, a writer) staging into ``table`` for a fresh run."""
    latest, op = layout
    io = ThreadPoolExecutor(1)
    run_id = f"m-{secrets.token_hex(3)}"
    writer = PostgresTableSinkWriter(
        io,
        dsn=asyncpg_dsn(platform.url),
        schema_name="public",
        table=table,
        columns=SCHEMA,
        partitioned=False,
        upsert_key=upsert_key,
        run_id=run_id,
        subtask=0,
        attempt="a1",
        latest_by=latest,
        op_field=op,
    )
    return io, run_id, writer


def _stage(
    platform: Platform,
    table: str,
    layout: tuple[str | None, str | None],
    batches: list[list[dict[str, Any]]],
    upsert_key: tuple[str, ...] | None = ("id",),
) -> list[StagedTransaction]:
    """One batch table per batch of ``batches`` (a pre-commit each): the staged transactions
    a checkpoint's completion commits."""
    io, run_id, writer = _writer(platform, table, layout, upsert_key)
    outs = []
    for rows in batches:
        writer.write_batch("", pa.RecordBatch.from_pylist(rows, schema=SCHEMA))
        outs.append(writer.pre_commit().result(timeout=60))
    io.submit(writer.close).result(timeout=30)
    io.shutdown()
    return [
        StagedTransaction(1, run_id, 0, "a1", 1, TABLE_SINK_NAME, o.files, o.rows) for o in outs
    ]


def _commit(
    platform: Platform,
    table: str,
    layout: tuple[str | None, str | None],
    batches: list[list[dict[str, Any]]],
    work_mem: str | None = None,
    upsert_key: tuple[str, ...] | None = ("id",),
) -> str:
    """Stage and commit ``batches``; the completion transaction's ``work_mem`` after the
    commit (``work_mem``: set for that transaction before it)."""
    txns = _stage(platform, table, layout, batches, upsert_key)
    with platform.engine.begin() as conn:
        if work_mem is not None:
            conn.execute(sa.text(f"SET LOCAL work_mem = '{work_mem}'"))
        PostgresTableSink(platform.engine).commit(conn, txns)
        return str(conn.execute(sa.text("SHOW work_mem")).scalar_one())


def _table(platform: Platform, table: str) -> dict[int, dict[str, Any]]:
    with platform.engine.connect() as conn:
        rows = conn.execute(sa.text(f"SELECT id, v, _op, _lsn FROM public.{table}")).mappings()
        return {r["id"]: dict(r) for r in rows}


@pytest.mark.parametrize("kind", list(LAYOUTS))
def test_merge_and_on_conflict_leave_the_oracle_s_table(
    platform: Platform, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    layout = LAYOUTS[kind]
    rng = random.Random(25)
    existing = _stream(rng, 80, 1000)  # stored rows, some of later events than the stream's
    commits = [[_stream(rng, 150, 900 + 300 * c + 150 * b) for b in range(2)] for c in range(3)]
    commits.append([_stream(rng, 100, 100)])  # late: mostly older than what is stored
    tables = {}
    for path in ("merge", "on conflict"):
        if path == "on conflict":
            monkeypatch.setattr(_table_commit, "merge_supported", lambda conn: False)
        table = f"mg_{secrets.token_hex(3)}"
        ensure_tables(
            platform.engine, "public", table, SCHEMA, partitioned=False, upsert_key=["id"]
        )
        _commit(platform, table, (layout[0], None), [existing])
        for batches in commits:
            _commit(platform, table, layout, batches)
        tables[path] = _table(platform, table)
        with platform.engine.connect() as conn:
            assert staged_rows(conn, "public", table) == 0
    expected = _oracle({}, [existing], layout[0], None)
    for batches in commits:
        expected = _oracle(expected, batches, *layout)
    assert tables["merge"] == expected
    assert tables["on conflict"] == expected
    if layout[1]:  # deletes and inserts both happened
        assert 10 < len(expected) < 60
    else:
        assert len(expected) == 60


@pytest.mark.parametrize("kind", ["latest event", "change stream"])
def test_a_key_inserted_meanwhile_falls_back_to_on_conflict(
    platform: Platform, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    # A change stream's commit first tries inserting its created keys (key 8) and merging
    # the rest: that statement meets the key too, and the commit then merges every row,
    # which sees the other transaction's key 7 committed by then and updates it.
    table = f"mg_{secrets.token_hex(3)}"
    ensure_tables(platform.engine, "public", table, SCHEMA, partitioned=False, upsert_key=["id"])
    other = platform.engine.connect()
    other.execute(sa.text(f"INSERT INTO public.{table} VALUES (7, 'theirs', 'c', 1)"))  # open
    committed = threading.Event()

    def commit_other() -> None:
        time.sleep(1.0)  # the MERGE below waits on the open insert of key 7
        other.commit()
        committed.set()

    thread = threading.Thread(target=commit_other)
    thread.start()
    try:
        rows = [
            {"id": 7, "v": "ours", "_op": "u", "_lsn": 5},
            {"id": 8, "v": "new", "_op": "c", "_lsn": 6},
        ]
        with caplog.at_level("INFO"):
            _commit(platform, table, LAYOUTS[kind], [rows])
    finally:
        thread.join()
        other.close()
    assert committed.is_set()
    if kind == "change stream":
        assert _fallbacks(caplog) == 1
    else:
        assert "upserting with ON CONFLICT instead" in caplog.text
    got = _table(platform, table)
    assert got == {
        7: {"id": 7, "v": "ours", "_op": "u", "_lsn": 5},
        8: {"id": 8, "v": "new", "_op": "c", "_lsn": 6},
    }


def test_the_commit_sorts_in_memory_for_its_transaction_only(platform: Platform) -> None:
    # An upsert's DISTINCT ON sorts a checkpoint's staged rows: work_mem is raised to 64MB
    # for the completion transaction (never lowered), and the server's setting is untouched.
    rows = [{"id": i, "v": "x", "_op": "c", "_lsn": i} for i in range(10)]
    table = f"mg_{secrets.token_hex(3)}"
    ensure_tables(platform.engine, "public", table, SCHEMA, partitioned=False, upsert_key=["id"])
    assert _commit(platform, table, LAYOUTS["change stream"], [rows]) == "64MB"
    assert _commit(platform, table, LAYOUTS["change stream"], [rows], "256MB") == "256MB"
    with platform.engine.connect() as conn:
        assert conn.execute(sa.text("SHOW work_mem")).scalar_one() != "64MB"
    appended = f"mg_{secrets.token_hex(3)}"  # no upsert: no sort, nothing raised
    ensure_tables(platform.engine, "public", appended, SCHEMA, partitioned=False, upsert_key=None)
    assert _commit(platform, appended, (None, None), [rows], upsert_key=None) != "64MB"


def test_a_sink_table_name_of_63_characters_upserts_aborts_and_sweeps(
    platform: Platform,
) -> None:
    """Postgres' longest name (63 bytes): the sink has no shared staging table from before
    the batch tables (``<table>__staged`` would not fit), and needs none — it stages, moves,
    aborts and sweeps through batch tables alone; the result equals the oracle's."""
    table = f"long_{secrets.token_hex(3)}_".ljust(63, "x")
    assert len(table) == 63
    ensure_tables(platform.engine, "public", table, SCHEMA, partitioned=False, upsert_key=["id"])
    rng = random.Random(63)
    commits = [[_stream(rng, 120, 500 * c + 200 * b) for b in range(2)] for c in range(2)]
    for batches in commits:
        _commit(platform, table, LAYOUTS["change stream"], batches)
    expected: dict[int, dict[str, Any]] = {}
    for batches in commits:
        expected = _oracle(expected, batches, *LAYOUTS["change stream"])
    assert _table(platform, table) == expected and expected
    # A batch staged and never completed: aborted, then nothing is left to sweep.
    io, run_id, writer = _writer(platform, table, LAYOUTS["change stream"])
    pending = _stream(rng, 50, 9000)
    writer.write_batch("", pa.RecordBatch.from_pylist(pending, schema=SCHEMA))
    out = writer.pre_commit().result(timeout=60)
    io.submit(writer.close).result(timeout=30)
    io.shutdown()
    with platform.engine.connect() as conn:
        # (the writer stages only each key's latest change)
        assert staged_rows(conn, "public", table) == len({row["id"] for row in pending})
    txn = StagedTransaction(1, run_id, 0, "a1", 1, TABLE_SINK_NAME, out.files, out.rows)
    PostgresTableSink(platform.engine).abort([txn])
    with platform.engine.connect() as conn:
        assert staged_rows(conn, "public", table) == 0
    assert sweep_staged(platform.engine, "public", table) == 0
    assert _table(platform, table) == expected


def _fallbacks(caplog: pytest.LogCaptureFixture) -> int:
    return caplog.text.count("merging every row instead")


def test_keys_created_in_a_batch_are_inserted_and_a_stored_one_falls_back(
    platform: Platform, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A change stream's batches mark the keys created in them; their winners are inserted
    # without a lookup. A created key that is stored after all (a snapshot row read after
    # the insert: a later _lsn) makes that insert fail, and the commit merges every row.
    statements: list[bool] = []  # per MERGE statement run: whether it inserted born keys
    real_merge = _table_merge._merge

    def merge(layout: Any, rows: Any, born: bool = False) -> Any:
        statements.append(born)
        return real_merge(layout, rows, born)

    monkeypatch.setattr(_table_merge, "_merge", merge)
    monkeypatch.setattr(_table_merge, "_SKIP_AFTER_FALLBACK", 2)
    table = f"mg_{secrets.token_hex(3)}"
    ensure_tables(platform.engine, "public", table, SCHEMA, partitioned=False, upsert_key=["id"])
    layout = LAYOUTS["change stream"]
    stored = [{"id": k, "v": f"old{k}", "_op": "r", "_lsn": 10} for k in range(5)]
    _commit(platform, table, layout, [stored])
    created = [
        {"id": 10, "v": "a", "_op": "c", "_lsn": 20},  # created, then updated: inserted
        {"id": 11, "v": "b", "_op": "c", "_lsn": 21},  # created, then deleted: nothing
        {"id": 1, "v": "new1", "_op": "u", "_lsn": 22},  # stored: merged
        {"id": 10, "v": "a2", "_op": "u", "_lsn": 23},
        {"id": 11, "v": "b", "_op": "d", "_lsn": 24},
        {"id": 2, "v": None, "_op": "d", "_lsn": 25},  # stored: deleted
        {"id": 12, "v": "c", "_op": "c", "_lsn": 26},
    ]
    # A second batch of the same commit updates a key created in the first.
    later = [{"id": 12, "v": "c2", "_op": "u", "_lsn": 27}]
    with caplog.at_level("INFO"):
        _commit(platform, table, layout, [created, later])
    assert _fallbacks(caplog) == 0
    assert statements == [True, True]  # the snapshot rows', then these
    expected = _oracle(_oracle({}, [stored], *layout), [created, later], *layout)
    assert _table(platform, table) == expected
    assert expected[10]["v"] == "a2" and 11 not in expected and 2 not in expected
    # Key 3 "created" at _lsn 5, while the stored row (the snapshot's) is of _lsn 10.
    replayed = [
        {"id": 3, "v": "early", "_op": "c", "_lsn": 5},
        {"id": 13, "v": "d", "_op": "c", "_lsn": 28},
    ]
    with caplog.at_level("INFO"):
        _commit(platform, table, layout, [replayed])
    assert _fallbacks(caplog) == 1
    assert statements[2:] == [True, False]
    expected = _oracle(expected, [replayed], *layout)
    assert _table(platform, table) == expected
    assert expected[3]["v"] == "old3" and expected[13]["v"] == "d"
    # The next commits of the table skip the attempt (a stream catching up with its
    # snapshot meets stored keys commit after commit), then it is tried again.
    for n in range(3):
        _commit(platform, table, layout, [[{"id": 20 + n, "v": "e", "_op": "c", "_lsn": 30 + n}]])
    assert statements[4:] == [False, False, True]
    assert _fallbacks(caplog) == 1
    assert _table(platform, table) == {
        **expected,
        **{20 + n: {"id": 20 + n, "v": "e", "_op": "c", "_lsn": 30 + n} for n in range(3)},
    }


def test_batches_staged_without_the_born_column_commit_alongside(
    platform: Platform, caplog: pytest.LogCaptureFixture
) -> None:
    # A batch table staged by a version before the column (its entry says nothing) commits
    # with the plain MERGE, together with newer ones.
    table = f"mg_{secrets.token_hex(3)}"
    ensure_tables(platform.engine, "public", table, SCHEMA, partitioned=False, upsert_key=["id"])
    layout = LAYOUTS["change stream"]
    batches = [
        [{"id": 1, "v": "a", "_op": "c", "_lsn": 1}, {"id": 2, "v": "b", "_op": "c", "_lsn": 2}],
        [{"id": 2, "v": "b2", "_op": "u", "_lsn": 3}, {"id": 3, "v": "c", "_op": "c", "_lsn": 4}],
    ]
    txns = _stage(platform, table, layout, batches)
    assert all(entry.get("born") is True for txn in txns for entry in txn.staged)
    del txns[0].staged[0]["born"]
    with caplog.at_level("INFO"), platform.engine.begin() as conn:
        PostgresTableSink(platform.engine).commit(conn, txns)
    assert _fallbacks(caplog) == 0
    assert _table(platform, table) == _oracle({}, batches, *layout)
