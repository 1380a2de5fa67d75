"""Checkpoints: barrier handling (alignment for EXACTLY_ONCE, tracking for AT_LEAST_ONCE),
the driver's coordinator and the task side's line to it.

The barrier handlers are generic over input channels identified by int index; in Sluice the
channels are the reader subtasks as seen by the coordinator, or the inputs of a multi-input
operator. Handlers are single-threaded (their owner's thread).
"""

from spark_jobs.checkpoint._aligned import AlignedBarrierHandler
from spark_jobs.checkpoint._common import (
    AbortCallback,
    AbortReason,
    CheckpointCallback,
    StreamCorruptError,
)
from spark_jobs.checkpoint._coordinator import (
    AbortedCheckpoint,
    CheckpointCoordinator,
    CoordinatorStats,
)
from spark_jobs.checkpoint._listener import CheckpointListener
from spark_jobs.checkpoint._tracker import MAX_CHECKPOINTS_TO_TRACK, BarrierTracker

__all__ = [
    "MAX_CHECKPOINTS_TO_TRACK",
    "AbortCallback",
    "AbortReason",
    "AbortedCheckpoint",
    "AlignedBarrierHandler",
    "BarrierTracker",
    "CheckpointCallback",
    "CheckpointCoordinator",
    "CheckpointListener",
    "CoordinatorStats",
    "StreamCorruptError",
]
