"""Split registration, two-level assignment, leases and fencing on a real Postgres."""

from __future__ import annotations

import threading
import time
from datetime import date
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from demo_platform import demo_discover

from enumerator_service import FencedError, FileSplit, Settings, SplitStore
from enumerator_service._operations import Platform, open_platform
from enumerator_service._schema import splits


@pytest.fixture
def platform(make_settings: Any) -> Platform:
    settings: Settings = make_settings()
    p = open_platform(settings)
    yield p
    p.close()


def _splits(source: str, n: int, day: date = date(2026, 1, 1)) -> list[FileSplit]:
    return [FileSplit(source, "jsonl", f"/landing/f{i:05d}.jsonl", 0, 100, day) for i in range(n)]


def test_a_pull_waits_for_splits_the_lease_heartbeat_holds_instead_of_ending(
    platform: Platform,
) -> None:
    # The heartbeat updates every split of the run; a pull meanwhile (SKIP LOCKED) saw none
    # and the subtask ended as if the run had no split left.
    store = SplitStore(platform.engine)
    source = platform.settings.source_name
    store.register(_splits(source, 5))
    assert store.assign_to_run("run-hb-lock", source, lease_seconds=60) == 5
    got: list[Any] = []
    with platform.engine.begin() as conn:  # the heartbeat's transaction, held open
        conn.execute(
            sa.update(splits)
            .where(splits.c.run_id == "run-hb-lock")
            .values(attempts=splits.c.attempts)
        )
        puller = threading.Thread(target=lambda: got.append(store.pull_next("run-hb-lock", 0, 60)))
        puller.start()
        time.sleep(0.5)
        assert not got  # waiting for the lock, not "none left"
    puller.join(10)
    assert got and got[0] is not None
    # The other four, then none: the run's splits are all handed out.
    pulled = [store.pull_next("run-hb-lock", 1, 60) for _ in range(5)]
    assert sum(a is not None for a in pulled) == 4 and pulled[-1] is None


def test_a_pull_never_waits_for_more_than_a_lease_on_a_stuck_lock(platform: Platform) -> None:
    store = SplitStore(platform.engine)
    source = platform.settings.source_name
    store.register(_splits(source, 1))
    assert store.assign_to_run("run-s", source, lease_seconds=60) == 1
    with platform.engine.begin() as conn:
        conn.execute(sa.select(splits.c.id).where(splits.c.run_id == "run-s").with_for_update())
        with pytest.raises(RuntimeError, match=r"run run-s: its unclaimed splits stayed locked"):
            store.pull_next("run-s", 0, 1.0)


def test_registration_is_idempotent(platform: Platform) -> None:
    store = SplitStore(platform.engine)
    source = platform.settings.source_name
    assert store.register(_splits(source, 50)) == 50
    assert store.register(_splits(source, 60)) == 10
    assert store.counts(source) == {"UNASSIGNED": 60}


def test_concurrent_pullers_get_each_split_exactly_once(platform: Platform) -> None:
    store = SplitStore(platform.engine)
    source = platform.settings.source_name
    store.register(_splits(source, 400))
    assert store.assign_to_run("run-a", source, lease_seconds=60) == 400
    got: list[list[int]] = [[] for _ in range(8)]

    def pull(subtask: int) -> None:
        while (a := store.pull_next("run-a", subtask, 60)) is not None:
            got[subtask].append(a.split_id)

    threads = [threading.Thread(target=pull, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ids = [s for per in got for s in per]
    assert len(ids) == 400 and len(set(ids)) == 400
    assert sum(1 for per in got if per) >= 2  # more than one puller got work


def test_stale_epoch_cannot_commit(platform: Platform) -> None:
    store = SplitStore(platform.engine)
    source = platform.settings.source_name
    store.register(_splits(source, 1))
    store.assign_to_run("run-b", source, lease_seconds=60)
    first = store.pull_next("run-b", 0, 60)
    assert first is not None
    # The task is retried: the new attempt reclaims the split under a new epoch.
    (second,) = store.reclaim("run-b", 0, 60)
    assert second.split_id == first.split_id and second.epoch == first.epoch + 1
    with platform.engine.begin() as conn, pytest.raises(FencedError):
        SplitStore.complete(conn, first, "run-b", 100, None)
    with platform.engine.begin() as conn:
        SplitStore.complete(conn, second, "run-b", 100, None)
    assert store.counts(source) == {"COMPLETED": 1}


def test_expired_leases_return_to_the_pool(platform: Platform) -> None:
    store = SplitStore(platform.engine)
    source = platform.settings.source_name
    store.register(_splits(source, 3))
    store.assign_to_run("run-c", source, lease_seconds=0.2)
    zombie = store.pull_next("run-c", 0, 0.2)
    assert zombie is not None
    time.sleep(0.5)  # the lease is measured by the database clock
    assert store.release_expired(source) == 3
    assert store.counts(source) == {"UNASSIGNED": 3}
    store.assign_to_run("run-d", source, lease_seconds=60)
    with platform.engine.begin() as conn, pytest.raises(FencedError):
        SplitStore.complete(conn, zombie, "run-c", 100, None)


def test_expired_leases_counts_a_runs_lapsed_leases_until_its_heartbeat(
    platform: Platform,
) -> None:
    store = SplitStore(platform.engine)
    source = platform.settings.source_name
    store.register(_splits(source, 3))
    store.assign_to_run("run-lapsed", source, lease_seconds=0.2)
    assert store.pull_next("run-lapsed", 0, 0.2) is not None
    assert store.expired_leases("run-lapsed") == 0
    time.sleep(0.5)  # the lease is measured by the database clock
    assert store.expired_leases("run-lapsed") == 3
    assert store.expired_leases("another-run") == 0
    store.heartbeat_run("run-lapsed", 60)
    assert store.expired_leases("run-lapsed") == 0
    # Completed splits are not held: their leases do not count.
    with platform.engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE sluice.splits SET status = 'COMPLETED', lease_expires_at = now() - "
            "interval '1 hour' WHERE run_id = 'run-lapsed'"
        )
    assert store.expired_leases("run-lapsed") == 0


def test_release_run_returns_uncommitted_splits_only(platform: Platform) -> None:
    store = SplitStore(platform.engine)
    source = platform.settings.source_name
    store.register(_splits(source, 3))
    store.assign_to_run("run-e", source, lease_seconds=60)
    done = store.pull_next("run-e", 0, 60)
    assert done is not None
    store.pull_next("run-e", 1, 60)
    with platform.engine.begin() as conn:
        SplitStore.complete(conn, done, "run-e", 100, None)
    assert store.release_run("run-e") == 2
    assert store.counts(source) == {"COMPLETED": 1, "UNASSIGNED": 2}


def test_assignment_restricted_to_dates(platform: Platform) -> None:
    store = SplitStore(platform.engine)
    source = platform.settings.source_name
    store.register(_splits(source, 2, date(2026, 1, 1)))
    store.register(
        [
            FileSplit(source, "jsonl", f"/landing/g{i}.jsonl", 0, 9, date(2026, 1, 2))
            for i in range(3)
        ]
    )
    assert (
        store.assign_to_run("run-f", source, lease_seconds=60, partition_keys=[date(2026, 1, 2)])
        == 3
    )


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_discovery_registers_each_file_once_with_a_bounded_cursor(platform: Platform) -> None:
    landing = platform.settings.landing_path
    for day in ("2026-01-01", "2026-01-02"):
        for part in range(2):
            _write(landing / f"dt={day}" / f"part-{part}.jsonl", '{"a": 1}\n')
    _write(landing / "dt=2026-01-01" / ".part-9.jsonl.tmp", "partial")
    _write(landing / "not-a-partition" / "x.jsonl", "{}\n")
    first = demo_discover(platform)
    assert (first.files_seen, first.splits_registered) == (4, 4)
    again = demo_discover(platform)
    assert again.splits_registered == 0
    _write(landing / "dt=2026-01-03" / "part-0.jsonl", '{"a": 2}\n')
    third = demo_discover(platform)
    assert third.splits_registered == 1
    assert len(third.cursor["recent_paths"]) <= 5
    with platform.engine.connect() as conn:
        keys = conn.execute(
            sa.select(splits.c.partition_key, sa.func.count())
            .where(splits.c.source == platform.settings.source_name)
            .group_by(splits.c.partition_key)
            .order_by(splits.c.partition_key)
        ).all()
    assert [(k.isoformat(), n) for k, n in keys] == [
        ("2026-01-01", 2),
        ("2026-01-02", 2),
        ("2026-01-03", 1),
    ]


def test_restoring_a_checkpoint_returns_exactly_the_later_hand_outs(platform: Platform) -> None:
    store = SplitStore(platform.engine)
    source = platform.settings.source_name
    store.register(_splits(source, 6))
    store.assign_to_run("run-g", source, lease_seconds=60)

    def pull(subtask: int) -> int:
        assignment = store.pull_next("run-g", subtask, 60)
        assert assignment is not None
        return assignment.split_id

    early = [pull(0), pull(0), pull(1)]
    assert store.snapshot_assignments("run-g", 1) == 3
    after_one = [pull(0)]
    assert store.snapshot_assignments("run-g", 2) == 1
    unsnapshotted = [pull(0)]

    # Subtask 0 fails and restores checkpoint 1: what it got after 1 goes back to the pool.
    assert store.restore_assignments("run-g", 0, 1) == sorted(after_one + unsnapshotted)
    assert store.counts(source) == {"READING": 3, "ASSIGNED": 3}
    # The returned splits are handed out again (to anyone), as new, uncheckpointed hand-outs.
    again = {pull(1), pull(1), pull(1)}
    assert set(after_one + unsnapshotted) <= again
    assert store.snapshot_assignments("run-g", 3) == 3

    # Restoring "before any checkpoint" returns every hand-out of the run.
    returned = store.restore_assignments("run-g", None, None)
    assert set(early) <= set(returned)
    assert store.counts(source) == {"ASSIGNED": 6}


def test_heartbeats_keep_a_live_run_s_splits(platform: Platform) -> None:
    store = SplitStore(platform.engine)
    source = platform.settings.source_name
    store.register(_splits(source, 2))
    store.assign_to_run("run-h", source, lease_seconds=0.3)
    assert store.pull_next("run-h", 0, 0.3) is not None
    for _ in range(3):
        time.sleep(0.15)  # leases are measured by the database clock
        assert store.heartbeat_run("run-h", 0.3) == 2
        assert store.release_expired(source) == 0
    time.sleep(0.4)  # the run stops renewing: its splits return to the pool
    assert store.release_expired(source) == 2


def test_each_split_type_comes_back_as_it_was_registered(platform: Platform) -> None:
    """The split row is the codec: a stream range (open or closed) and a table range of a
    non-default kind come back as the types and values they were registered as."""
    from enumerator_service import StreamSplit, TableRangeSplit

    store = SplitStore(platform.engine)
    source = platform.settings.source_name
    registered = [
        StreamSplit(source, "kafka", "orders/3", 17, None),
        StreamSplit(source, "kafka", "orders/0", 0, 1_000_000_000_000),
        StreamSplit(source, "pgcdc", "sluice_slot", 2**40, None),
        TableRangeSplit(source, "public.t", "id", 0, 5000, "pgcdc-chunk"),
        _splits(source, 1)[0],
    ]
    assert store.register(registered) == len(registered)
    store.assign_to_run("run-a", source, lease_seconds=60)
    pulled = []
    while (a := store.pull_next("run-a", 0, 60)) is not None:
        pulled.append(a)
    by_identity = {a.split.identity: a.split for a in pulled}
    for split in registered:
        back = by_identity[split.identity]
        assert type(back) is type(split)
        assert (back.kind, back.start, back.end) == (split.kind, split.start, split.end)
