"""Several splits per pull (``SplitStore.pull_splits``) on a real Postgres: concurrent pullers
never share a split, every split keeps its own epoch and lease, the byte budget and unknown
sizes bound a batch, order is (partition_key, id), and a reader that dies gives back (or its
retry reclaims) every split of its batches — read or not."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator
from datetime import date, timedelta

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from enumerator_service import FencedError, FileSplit, SplitAssignment, SplitStore
from enumerator_service._database import connect_engine, upgrade_schema
from enumerator_service._schema import splits

PULLERS = 8
SPLITS = 2_000
DAYS = 4
BATCH = 16


@pytest.fixture(scope="module")
def engine(db_url: str) -> Iterator[Engine]:
    engine = connect_engine(db_url, pool_size=PULLERS)
    upgrade_schema(engine)
    yield engine
    engine.dispose()


def _run(store: SplitStore, found: list[FileSplit]) -> str:
    """Register ``found`` under its source and assign all of it to a fresh run."""
    run_id = f"run-{found[0].source}"
    assert store.register(found) == len(found)
    assert store.assign_to_run(run_id, found[0].source, lease_seconds=600) == len(found)
    return run_id


def _small(source: str, n: int, size: int = 100, day: date = date(2026, 1, 1)) -> list[FileSplit]:
    return [
        FileSplit(source, "jsonl", f"/l/{source}/{i:05d}.jsonl", 0, size, day) for i in range(n)
    ]


def _rows(engine: Engine, source: str) -> dict[int, sa.Row[tuple[object, ...]]]:
    with engine.connect() as conn:
        result = conn.execute(sa.select(splits).where(splits.c.source == source))
        return {row.id: row for row in result}


def test_concurrent_batched_pullers_never_share_a_split_and_each_keeps_its_epoch(
    engine: Engine,
) -> None:
    store = SplitStore(engine)
    source = f"batch_{secrets.token_hex(4)}"
    # Newest day registered first, so (partition_key, id) order differs from id order.
    found = [
        FileSplit(source, "jsonl", f"/l/{source}/{day}/{i:05d}.jsonl", 0, 100, day)
        for day in (date(2026, 2, 1) + timedelta(days=d) for d in reversed(range(DAYS)))
        for i in range(SPLITS // DAYS)
    ]
    run_id = _run(store, found)
    batches: list[list[list[SplitAssignment]]] = [[] for _ in range(PULLERS)]
    errors: list[BaseException] = []
    start_line = threading.Barrier(PULLERS)

    def pull(subtask: int) -> None:
        try:
            start_line.wait(timeout=30)
            while got := store.pull_splits(
                run_id, subtask, 60, max_splits=BATCH, max_bytes=1 << 20
            ):
                batches[subtask].append(got)
        except BaseException as exc:  # re-raised in the test thread
            errors.append(exc)

    threads = [threading.Thread(target=pull, args=(i,)) for i in range(PULLERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads), "a puller hung"
    if errors:
        raise errors[0]

    ids = [a.split_id for per in batches for batch in per for a in batch]
    assert len(ids) == len(set(ids)) == SPLITS, "a split was handed out twice or never"
    sizes = [len(batch) for per in batches for batch in per]
    assert max(sizes) == BATCH and all(1 <= n <= BATCH for n in sizes)
    assert len(sizes) < SPLITS // 4, "pulls were not batched"
    # Every batch is in (partition_key, id) order; each split was handed out once, under its
    # own epoch 1 and lease, to the subtask that received it.
    for per in batches:
        for batch in per:
            keys = [(a.split.partition_key, a.split_id) for a in batch]
            assert keys == sorted(keys)
    holder = {a.split_id: k for k, per in enumerate(batches) for batch in per for a in batch}
    rows = _rows(engine, source)
    assert all(row.status == "READING" and row.epoch == 1 for row in rows.values())
    assert all(row.attempts == 1 and row.lease_expires_at is not None for row in rows.values())
    assert all(holder[i] == row.subtask for i, row in rows.items())
    assert store.pull_splits(run_id, 0, 60, max_splits=BATCH, max_bytes=1 << 20) == []


def test_a_single_batched_puller_keeps_partition_then_id_order(engine: Engine) -> None:
    store = SplitStore(engine)
    source = f"order_{secrets.token_hex(4)}"
    days = [date(2026, 3, 3), date(2026, 3, 1), date(2026, 3, 2)]
    found = [
        FileSplit(source, "jsonl", f"/l/{day}/{i}.jsonl", 0, 1, day)
        for i in range(5)
        for day in days
    ]
    run_id = _run(store, found)
    pulled: list[SplitAssignment] = []
    while got := store.pull_splits(run_id, 0, 60, max_splits=4, max_bytes=1 << 20):
        assert len(got) <= 4
        pulled.extend(got)
    keys = [(a.split.partition_key, a.split_id) for a in pulled]
    assert len(keys) == 15 and keys == sorted(keys)


def test_the_byte_budget_and_unknown_sizes_bound_a_batch(engine: Engine) -> None:
    store = SplitStore(engine)
    source = f"budget_{secrets.token_hex(4)}"
    day = date(2026, 1, 1)
    found = [
        *_small(source, 3, size=100),  # 100 + 100 fit 250, the third does not
        FileSplit(source, "jsonl", f"/l/{source}/big.jsonl", 0, 1000, day),  # over the budget
        FileSplit(source, "jsonl.gz", f"/l/{source}/a.jsonl.gz", 0, None, day),  # size unknown
        FileSplit(source, "csv", f"/l/{source}/b.csv", 0, 50, day),
        FileSplit(source, "parquet", f"/l/{source}/c.parquet", 0, 1, day),  # row groups
        FileSplit(source, "csv", f"/l/{source}/d.csv", 0, 50, day),
    ]
    run_id = _run(store, found)
    names = []
    while got := store.pull_splits(run_id, 0, 60, max_splits=8, max_bytes=250):
        names.append([a.split.path.rsplit("/", 1)[1] for a in got])
    assert names == [
        ["00000.jsonl", "00001.jsonl"],
        ["00002.jsonl"],  # the big split after it does not fit
        ["big.jsonl"],  # over the budget: alone, but handed out
        ["a.jsonl.gz"],  # unknown size: alone
        ["b.csv"],  # the Parquet split after it counts as unknown
        ["c.parquet"],
        ["d.csv"],
    ]
    # A budget of 0 or one split per request is one split per pull.
    source1 = f"one_{secrets.token_hex(4)}"
    run1 = _run(store, _small(source1, 3))
    assert len(store.pull_splits(run1, 0, 60, max_splits=8, max_bytes=0)) == 1
    assert len(store.pull_splits(run1, 0, 60, max_splits=1, max_bytes=1 << 20)) == 1
    with pytest.raises(ValueError, match="max_splits"):
        store.pull_splits(run1, 0, 60, max_splits=0, max_bytes=0)


def test_a_dead_readers_whole_batch_goes_back_or_to_its_retry(engine: Engine) -> None:
    store = SplitStore(engine)
    source = f"dead_{secrets.token_hex(4)}"
    run_id = _run(store, _small(source, 10))
    batch = store.pull_splits(run_id, 0, 60, max_splits=5, max_bytes=1 << 20)
    assert len(batch) == 5
    # Its retry reclaims every split of the batch, read or not, each under its own new epoch;
    # the dead attempt can commit none of them.
    reclaimed = store.reclaim(run_id, 0, 60)
    assert [a.split_id for a in reclaimed] == [a.split_id for a in batch]
    assert all(new.epoch == old.epoch + 1 for old, new in zip(batch, reclaimed, strict=True))
    for old in batch:
        with engine.begin() as conn, pytest.raises(FencedError):
            SplitStore.complete(conn, old, run_id, 100, None)
    # Restored to before any checkpoint, the subtask gives the whole batch back to the run's
    # pool, where another subtask pulls it.
    assert store.restore_assignments(run_id, 0, None) == sorted(a.split_id for a in batch)
    again = store.pull_splits(run_id, 1, 60, max_splits=16, max_bytes=1 << 20)
    assert {a.split_id for a in batch} <= {a.split_id for a in again}
    assert len(again) == 10
    assert {a.epoch for a in again if a.split_id in {b.split_id for b in batch}} == {3}


def test_a_batch_whose_reader_stopped_renewing_returns_to_the_pool(engine: Engine) -> None:
    store = SplitStore(engine)
    source = f"lapse_{secrets.token_hex(4)}"
    run_id = _run(store, _small(source, 6))
    zombie = store.pull_splits(run_id, 0, 0.2, max_splits=4, max_bytes=1 << 20)
    assert len(zombie) == 4
    time.sleep(0.5)  # the leases are measured by the database clock
    assert store.expired_leases(run_id) == 4  # the 2 unpulled splits keep the run's lease
    assert store.release_expired(source) == 4
    assert store.counts(source) == {"UNASSIGNED": 4, "ASSIGNED": 2}
    for old in zombie:
        with engine.begin() as conn, pytest.raises(FencedError):
            SplitStore.complete(conn, old, run_id, 100, None)
