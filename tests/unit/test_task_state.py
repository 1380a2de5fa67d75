"""A subtask's checkpointed state: per split, its offset and the source ranges the chain has
not emitted (whole ranges, or some records of a range), in the order restore reads them; a
range being re-read stays pending until its last block was handed to the chain."""

from __future__ import annotations

import pytest

from enumerator_service import FileSplit, SplitAssignment, SplitState
from spark_jobs.jobs._stages import PendingRange
from spark_jobs.jobs._task_state import (
    TaskSplit,
    decode_pending,
    encode_pending,
    snapshot_splits,
)


def held(split_id: int, offset: int, pending: tuple[object, ...] = ()) -> TaskSplit:
    split = FileSplit("s", "jsonl", "/f", 0, None, None)
    return TaskSplit(SplitAssignment(split_id, split, 4, 0, pending), SplitState(offset=offset))


def test_ranges_of_every_stage_are_snapshotted_per_split_in_offset_order() -> None:
    splits = {3: held(3, 900), 5: held(5, 40)}
    pending = [
        PendingRange(3, 600, 900),  # a block in a later stage
        PendingRange(3, 100, 450, (120, 300, 120)),  # records of a per-record step
        PendingRange(5, 0, 40),
    ]
    states = snapshot_splits(splits, pending, checkpoint_id=7)
    assert states == [
        {
            "id": 3,
            "epoch": 4,
            "offset": 900,
            "watermark": None,
            "finished": False,
            "pending": [{"span": [100, 450], "only": [120, 300]}, {"span": [600, 900]}],
        },
        {
            "id": 5,
            "epoch": 4,
            "offset": 40,
            "watermark": None,
            "finished": False,
            "pending": [{"span": [0, 40]}],
        },
    ]
    restored = decode_pending(3, states[0]["pending"])
    assert restored == [PendingRange(3, 100, 450, (120, 300)), PendingRange(3, 600, 900)]
    assert encode_pending(restored) == states[0]["pending"]


def test_a_finished_split_with_nothing_pending_is_finished_in_that_checkpoint() -> None:
    done = held(3, 900)
    done.reading_done = True
    states = snapshot_splits({3: done}, [PendingRange(3, 800, 900)], checkpoint_id=1)
    assert states[0]["finished"] and done.finished_in is None  # still pending: not yet
    states = snapshot_splits({3: done}, [], checkpoint_id=2)
    assert states[0]["pending"] == [] and done.finished_in == 2


def test_ranges_being_re_read_stay_pending_until_their_last_block() -> None:
    entries = ({"span": [0, 300]}, {"span": [200, 900], "only": [250, 700]})
    split = held(3, 900, entries)
    split.replay = dict(enumerate(decode_pending(3, entries)))
    # The first block of entry 0 covers [0, 120): [120, 300) is left of it.
    assert split.replayed(0, 120) == PendingRange(3, 0, 300)
    assert snapshot_splits({3: split}, [], 1)[0]["pending"] == [
        {"span": [120, 300]},
        {"span": [200, 900], "only": [250, 700]},
    ]
    # A block of entry 1 means entry 0 is done; [0, 500) of entry 1 is read.
    assert split.replayed(1, 500) == PendingRange(3, 200, 900, (250, 700))
    assert snapshot_splits({3: split}, [], 2)[0]["pending"] == [{"span": [500, 900], "only": [700]}]
    assert split.replayed(1, 950) is not None
    assert split.replay == {}


def test_pending_inputs_of_older_versions_fail_with_a_clear_message() -> None:
    with pytest.raises(ValueError, match="checkpointed by a version before pipelines"):
        decode_pending(3, [["e1", 1, "2026-01-01T00:00:00+00:00", "click", 1.0]])
