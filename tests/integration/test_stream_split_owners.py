"""Stream partitions are pulled only by their owner subtask (Flink's KafkaSourceEnumerator
rule, in the pull statement): a topic's partitions spread round-robin over the subtasks, a
partition found later goes to its owner, its day splits too, and other kinds of split still
go to whoever asks."""

from __future__ import annotations

import secrets
from datetime import UTC, date, datetime
from typing import Any

from enumerator_service import SplitStore, StreamSplit
from enumerator_service._completeness import NO_WATERMARK
from enumerator_service._operations import open_platform
from enumerator_service._run_watermark import run_watermark_of


def _pull_all(store: SplitStore, run: str, subtask: int, owners: int) -> list[str]:
    pulled: list[str] = []
    while batch := store.pull_splits(
        run, subtask, 60, max_splits=1, owned_kinds=("kafka",), owners=owners
    ):
        pulled += [a.split.path for a in batch]
    return pulled


def test_each_partition_is_pulled_by_its_owner_only(make_settings: Any) -> None:
    settings = make_settings()
    platform = open_platform(settings)
    try:
        store, source = SplitStore(platform.engine), f"own_{secrets.token_hex(3)}"
        topic = f"t{secrets.token_hex(2)}"
        store.register([StreamSplit(source, "kafka", f"{topic}/{p}", 0, None) for p in range(4)])
        run = f"run-{source}"
        store.assign_to_run(run, source, lease_seconds=60)
        first, second = _pull_all(store, run, 0, 2), _pull_all(store, run, 1, 2)
        assert (len(first), len(second)) == (2, 2)  # round-robin within the topic
        assert sorted(first + second) == [f"{topic}/{p}" for p in range(4)]
        # Partition parity decides within one topic: the owner of p is (start + p) % 2.
        assert len({int(p.rpartition("/")[2]) % 2 for p in first}) == 1
        owner = dict.fromkeys(first, 0) | dict.fromkeys(second, 1)
        # Found later: a new partition, and day splits of known ones, go to their owner.
        later = [
            StreamSplit(source, "kafka", f"{topic}/4", 0, None),
            StreamSplit(source, "kafka", f"{topic}/1@2026-05-02", 0, 9),
        ]
        store.register(later)
        store.assign_to_run(run, source, lease_seconds=60)
        zero, one = _pull_all(store, run, 0, 2), _pull_all(store, run, 1, 2)
        assert sorted(zero + one) == sorted(s.path for s in later)
        assert f"{topic}/4" in (zero if owner[f"{topic}/0"] == 0 else one)  # parity of 0
        assert f"{topic}/1@2026-05-02" in (zero if owner[f"{topic}/1"] == 0 else one)
        # Without owned kinds, any subtask takes any split (other sources: unchanged).
        store.register([StreamSplit(source, "kafka", f"{topic}/9", 0, None)])
        store.assign_to_run(run, source, lease_seconds=60)
        assert [a.split.path for a in store.pull_splits(run, 5, 60, max_splits=1)] == [f"{topic}/9"]
    finally:
        platform.close()


def test_a_streams_day_split_goes_only_to_a_run_of_its_day(make_settings: Any) -> None:
    settings = make_settings()
    platform = open_platform(settings)
    try:
        store, source = SplitStore(platform.engine), f"day_{secrets.token_hex(3)}"
        day = date(2026, 5, 2)
        store.register(
            [
                StreamSplit(source, "kafka", "t/0", 0, None),
                StreamSplit(source, "kafka", "t/0@2026-05-02", 10, 20, day),
            ]
        )
        # A run of all new input (continuous, scheduled) takes the main line only.
        assert store.assign_to_run("all", source, lease_seconds=60) == 1
        assert store.assign_to_run("day", source, lease_seconds=60, partition_keys=[day]) == 1
        assert [a.split.path for a in store.pull_splits("day", 0, 60, max_splits=5)] == [
            "t/0@2026-05-02"
        ]
    finally:
        platform.close()


def _watermark_of(platform: Any, run: str, snapshots: list[dict[str, Any]]) -> Any:
    with platform.engine.connect() as conn:
        return run_watermark_of(conn, run, [(s, False) for s in snapshots])


def test_a_pulled_stream_split_not_yet_in_its_readers_snapshot_stops_the_run_watermark(
    make_settings: Any,
) -> None:
    platform = open_platform(make_settings())
    try:
        store, source = SplitStore(platform.engine), f"rw_{secrets.token_hex(3)}"
        run = f"run-{source}"
        reached = datetime(2026, 5, 3, 11, 58, tzinfo=UTC).isoformat()
        store.register([StreamSplit(source, "kafka", f"t/{p}", 0, None) for p in range(2)])
        store.assign_to_run(run, source, lease_seconds=60)
        # Assigned, not pulled: no new information whatever the (idle) subtasks say.
        idle = {"watermark": reached, "idle": True, "splits": []}
        assert _watermark_of(platform, run, [idle]) == NO_WATERMARK
        (first,) = store.pull_splits(run, 0, 60, max_splits=1, owned_kinds=("kafka",))
        (second,) = store.pull_splits(run, 0, 60, max_splits=1, owned_kinds=("kafka",))
        # Pulled, but one is not in its subtask's reader at the barrier (the fetcher had not
        # announced it yet): its records are unknown, the all-idle rule must not pass them.
        held = {**idle, "splits": [{"id": first.split_id}]}
        assert _watermark_of(platform, run, [held]) == NO_WATERMARK
        both = {**idle, "splits": [{"id": first.split_id}, {"id": second.split_id}]}
        assert _watermark_of(platform, run, [both]).isoformat() == reached
        # A CDC stream split READING keeps the file rules: it may wait in its fetcher behind
        # the snapshot chunks pulled with it, so an all-idle run does not pass it...
        cdc, cdc_run = f"cdc_{secrets.token_hex(3)}", f"run-cdc-{secrets.token_hex(3)}"
        store.register([StreamSplit(cdc, "pgcdc", "slot", 0, None)])
        store.assign_to_run(cdc_run, cdc, lease_seconds=60)
        active = {"watermark": reached, "idle": False, "splits": []}
        # ...and, ASSIGNED, it does not stop an active run (unchanged for CDC).
        assert _watermark_of(platform, cdc_run, [active]).isoformat() == reached
        (stream,) = store.pull_splits(cdc_run, 0, 60, max_splits=1)
        assert _watermark_of(platform, cdc_run, [idle]) == NO_WATERMARK
        held = {**idle, "splits": [{"id": stream.split_id}]}
        assert _watermark_of(platform, cdc_run, [held]) == NO_WATERMARK
    finally:
        platform.close()
