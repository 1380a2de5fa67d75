"""Pull-based assignment under real concurrency: 8 pullers over 10,000 splits, then fencing."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterator
from datetime import date, timedelta

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from enumerator_service import FencedError, FileSplit, SplitAssignment, SplitStore
from enumerator_service._database import connect_engine, upgrade_schema
from enumerator_service._schema import splits

PULLERS = 8
SPLITS = 10_000
DAYS = 10


@pytest.fixture(scope="module")
def engine(db_url: str) -> Iterator[Engine]:
    """One Engine shared by every puller thread: a pooled connection each (at most 10)."""
    engine = connect_engine(db_url, pool_size=PULLERS)
    upgrade_schema(engine)
    yield engine
    engine.dispose()


def _register(store: SplitStore, source: str) -> None:
    # Registered newest day first, so (partition_key, id) order differs from id order.
    per_day = SPLITS // DAYS
    found = [
        FileSplit(
            source,
            "jsonl",
            f"/landing/dt={day.isoformat()}/part-{i:05d}.jsonl",
            0,
            100,
            day,
        )
        for day in (date(2026, 1, 1) + timedelta(days=d) for d in reversed(range(DAYS)))
        for i in range(per_day)
    ]
    assert store.register(found) == SPLITS


def _pull_concurrently(store: SplitStore, run_id: str) -> list[list[SplitAssignment]]:
    got: list[list[SplitAssignment]] = [[] for _ in range(PULLERS)]
    errors: list[BaseException] = []
    start_line = threading.Barrier(PULLERS)

    def pull(subtask: int) -> None:
        try:
            start_line.wait(timeout=30)
            while (assignment := store.pull_next(run_id, subtask, 60)) is not None:
                got[subtask].append(assignment)
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
    return got


def test_eight_pullers_get_every_split_exactly_once_and_stale_epochs_are_fenced(
    engine: Engine,
) -> None:
    store = SplitStore(engine)
    source = f"conc_{secrets.token_hex(4)}"
    run_id = f"run-{source}"
    _register(store, source)
    assert store.assign_to_run(run_id, source, lease_seconds=600) == SPLITS

    got = _pull_concurrently(store, run_id)

    ids = [a.split_id for per in got for a in per]
    assert len(ids) == len(set(ids)), "a split was handed out twice"
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(splits.c.id, splits.c.status, splits.c.subtask, splits.c.epoch).where(
                splits.c.source == source
            )
        ).all()
    assert set(ids) == {row.id for row in rows}, "a split was never handed out"
    assert all(len(per) > 0 for per in got), [len(per) for per in got]
    # Each hand-out is recorded for the subtask that received it, under epoch 1.
    holder = {a.split_id: subtask for subtask, per in enumerate(got) for a in per}
    assert all(row.status == "READING" and row.epoch == 1 for row in rows)
    assert all(holder[row.id] == row.subtask for row in rows)
    assert all(a.epoch == 1 and a.resume_offset == 0 for per in got for a in per)
    assert store.pull_next(run_id, 0, 60) is None

    # Subtask 3 is retried: the new attempt reclaims its splits under a new epoch, so the
    # earlier attempt (a zombie) can no longer commit the split it was reading.
    old = got[3][-1]
    reissued = {a.split_id: a for a in store.reclaim(run_id, 3, 60)}
    assert set(reissued) == {a.split_id for a in got[3]}
    new = reissued[old.split_id]
    assert new.epoch == old.epoch + 1
    with engine.begin() as conn, pytest.raises(FencedError):
        SplitStore.complete(conn, old, run_id, 100, None)
    with engine.begin() as conn:
        SplitStore.complete(conn, new, run_id, 100, None)
    with engine.connect() as conn:
        status, offset = conn.execute(
            sa.select(splits.c.status, splits.c.committed_offset).where(splits.c.id == old.split_id)
        ).one()
    assert (status, offset) == ("COMPLETED", 100)
    # Once completed, the split is not re-committable under either epoch.
    with engine.begin() as conn, pytest.raises(FencedError):
        SplitStore.complete(conn, new, run_id, 100, None)
    assert store.counts(source) == {"READING": SPLITS - 1, "COMPLETED": 1}


def test_a_single_puller_gets_the_splits_in_partition_then_id_order(engine: Engine) -> None:
    store = SplitStore(engine)
    source = f"order_{secrets.token_hex(4)}"
    run_id = f"run-{source}"
    days = [date(2026, 3, 3), date(2026, 3, 1), date(2026, 3, 2)]
    store.register(
        FileSplit(source, "jsonl", f"/landing/{day}/{i}.jsonl", 0, 1, day)
        for i in range(3)
        for day in days
    )
    store.assign_to_run(run_id, source, lease_seconds=60)
    pulled: list[SplitAssignment] = []
    while (assignment := store.pull_next(run_id, 0, 60)) is not None:
        pulled.append(assignment)
    keys = [(a.split.partition_key, a.split_id) for a in pulled]
    assert len(keys) == 9 and keys == sorted(keys)
