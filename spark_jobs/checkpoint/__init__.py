"""Checkpoints: barrier handling (alignment for EXACTLY_ONCE, tracking for AT_LEAST_ONCE)
and the task side's line to the coordinator.

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

# Last: it imports enumerator_service, whose coordinator imports the handlers above.
from spark_jobs.checkpoint._listener import CheckpointListener
from spark_jobs.checkpoint._tracker import MAX_CHECKPOINTS_TO_TRACK, BarrierTracker

__all__ = [
    "MAX_CHECKPOINTS_TO_TRACK",
    "AbortCallback",
    "AbortReason",
    "AlignedBarrierHandler",
    "BarrierTracker",
    "CheckpointCallback",
    "CheckpointListener",
    "StreamCorruptError",
]
