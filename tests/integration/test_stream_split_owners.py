"""Stream partitions are pulled only by their owner subtask (Flink's KafkaSourceEnumerator
rule, in the pull statement): a topic's partitions spread round-robin over the subtasks, a
partition found later goes to its owner, its day splits too, and other kinds of split still
go to whoever asks."""

from __future__ import annotations

import secrets
from datetime import date
from typing import Any

from enumerator_service import SplitStore, StreamSplit
from enumerator_service._operations import open_platform


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
