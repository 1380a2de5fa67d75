"""Checkpoint barrier handling: alignment (EXACTLY_ONCE) and tracking (AT_LEAST_ONCE).

Generic over input channels identified by int index; in Sluice the channels are the reader
subtasks as seen by the coordinator, or the inputs of a multi-input operator. All handlers run
on the mailbox thread only.
"""

from spark_jobs.checkpoint._aligned import AlignedBarrierHandler
from spark_jobs.checkpoint._common import (
    AbortCallback,
    AbortReason,
    CheckpointCallback,
    StreamCorruptError,
)
from spark_jobs.checkpoint._tracker import MAX_CHECKPOINTS_TO_TRACK, BarrierTracker

__all__ = [
    "MAX_CHECKPOINTS_TO_TRACK",
    "AbortCallback",
    "AbortReason",
    "AlignedBarrierHandler",
    "BarrierTracker",
    "CheckpointCallback",
    "StreamCorruptError",
]
