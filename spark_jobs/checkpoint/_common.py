"""Shared pieces of the barrier handlers: abort reasons, errors, per-channel input validation.

Everything here is used from the mailbox thread only; nothing is thread-safe.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum

__all__ = [
    "AbortCallback",
    "AbortReason",
    "ChannelGuard",
    "CheckpointCallback",
    "StreamCorruptError",
]


class AbortReason(StrEnum):
    """Why a barrier handler gave up on a checkpoint (second argument of ``on_abort``)."""

    #: A barrier (or cancellation marker) of a newer checkpoint arrived first.
    SUBSUMED = "subsumed"
    #: A cancellation marker (Flink's ``CancelCheckpointMarker``) for this checkpoint arrived.
    CANCELLED = "cancelled"
    #: An input channel ended while the checkpoint was being aligned.
    END_OF_PARTITION = "end_of_partition"


CheckpointCallback = Callable[[int], None]
"""``on_checkpoint(checkpoint_id)``: all barriers of the checkpoint are in; snapshot now."""

AbortCallback = Callable[[int, AbortReason], None]
"""``on_abort(checkpoint_id, reason)``: the checkpoint will not complete on this input."""


class StreamCorruptError(RuntimeError):
    """The input violates the barrier protocol (Flink: "Stream corrupt").

    Raised for a repeated (or out-of-order) barrier on one channel, and for anything arriving
    on a channel after its end of partition.
    """


class ChannelGuard:
    """Validates the raw input of a handler, per channel, as it arrives (before any buffering).

    Barrier ids carried by one channel are strictly increasing: a barrier whose id is not
    greater than the last barrier seen on that channel is a repeated barrier, and the stream
    is corrupt. Cancellation markers are not ordered against barriers (a trailing marker of an
    older checkpoint is legal and ignored). Nothing may follow a channel's end of partition.
    """

    __slots__ = ("_ended", "_last_id", "num_channels")

    def __init__(self, num_channels: int) -> None:
        if num_channels < 1:
            raise ValueError(f"num_channels must be >= 1, got {num_channels}")
        self.num_channels = num_channels
        self._last_id = [-1] * num_channels
        self._ended = [False] * num_channels

    def check_range(self, channel: int) -> None:
        """Raise ``ValueError`` for an unknown channel."""
        if not 0 <= channel < self.num_channels:
            raise ValueError(f"channel {channel} out of range [0, {self.num_channels})")

    def check_channel(self, channel: int) -> None:
        """Raise ``ValueError`` for an unknown channel, ``StreamCorruptError`` after its end."""
        self.check_range(channel)
        if self._ended[channel]:
            raise StreamCorruptError(f"Stream corrupt: input on channel {channel} after its end")

    def check_barrier(self, channel: int, checkpoint_id: int) -> None:
        """Validate a barrier and record its id as the channel's latest barrier."""
        self.check_cancellation(channel, checkpoint_id)
        if checkpoint_id <= self._last_id[channel]:
            raise StreamCorruptError(
                "Stream corrupt: repeated barrier for same checkpoint and input stream "
                f"(channel {channel}, checkpoint {checkpoint_id}, "
                f"last barrier {self._last_id[channel]})"
            )
        self._last_id[channel] = checkpoint_id

    def check_cancellation(self, channel: int, checkpoint_id: int) -> None:
        """Validate a cancellation marker (trailing markers are legal and ignored later)."""
        self.check_channel(channel)
        if checkpoint_id < 0:
            raise ValueError(f"checkpoint ids are non-negative, got {checkpoint_id}")

    def end(self, channel: int) -> None:
        """Record the channel's end of partition."""
        self.check_channel(channel)
        self._ended[channel] = True
