"""EXACTLY_ONCE barrier alignment (Flink's ``BarrierBuffer``), generic over int channels.

Threading: every method runs on the mailbox thread only. The handler is not thread-safe and
never blocks the thread; "blocked" means a channel's input is held back in memory.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Generic, TypeVar

from spark_jobs.checkpoint._common import (
    AbortCallback,
    AbortReason,
    ChannelGuard,
    CheckpointCallback,
)

__all__ = ["AlignedBarrierHandler"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class _Element(Generic[T]):
    channel: int
    element: T


@dataclass(frozen=True, slots=True)
class _Barrier:
    channel: int
    checkpoint_id: int


@dataclass(frozen=True, slots=True)
class _Cancel:
    channel: int
    checkpoint_id: int


@dataclass(frozen=True, slots=True)
class _EndOfPartition:
    channel: int


_Event = _Element[T] | _Barrier | _Cancel | _EndOfPartition


class AlignedBarrierHandler(Generic[T]):
    """Aligns checkpoint barriers over ``num_channels`` input channels (EXACTLY_ONCE).

    Semantics (Flink's ``BarrierBuffer``):

    * Checkpoint ids are strictly increasing. A channel that delivered barrier *n* is
      **blocked**: everything it sends afterwards (elements, barriers, markers, end of
      partition) is buffered, not processed.
    * When every channel delivered *n* or is closed (``barriers + closed == channels``),
      ``on_checkpoint(n)`` is called, all channels unblock and the buffered input is replayed
      in arrival order (replayed barriers may start the next alignment at once).
    * A barrier of a newer checkpoint *m* during the alignment of *n* calls
      ``on_abort(n, SUBSUMED)``, releases the blocks and starts aligning *m*. Barriers older
      than the current checkpoint, and barriers of a checkpoint already aborted, are ignored.
    * A cancellation marker for the pending checkpoint aborts it (``CANCELLED``); a marker for
      a newer one aborts the pending one (``SUBSUMED``) and then the newer one (``CANCELLED``),
      so no alignment starts for it.
    * End of partition closes the channel. Channels closed before an alignment starts count as
      delivered; a channel ending *during* an alignment (including the end of the whole
      stream) aborts it (``END_OF_PARTITION``) and releases the blocks: it can no longer
      deliver the barrier.
    * A repeated barrier on one channel raises ``StreamCorruptError``.

    Output: each ``process_*`` call returns the elements that may flow downstream now, in
    order. ``on_checkpoint`` / ``on_abort`` are called during the call, and the handler never
    calls them while elements it has returned-to-be are still undelivered: if replayed input
    reaches a barrier after some elements were collected, the call returns those elements
    first and the rest stays queued (``has_pending``). Call ``release()`` until ``has_pending``
    is false (the next ``process_*`` call also continues the replay before its own input).
    Callbacks must not call back into the handler.

    Threading: mailbox thread only.
    """

    def __init__(
        self,
        num_channels: int,
        on_checkpoint: CheckpointCallback,
        on_abort: AbortCallback,
    ) -> None:
        self._guard = ChannelGuard(num_channels)
        self._on_checkpoint = on_checkpoint
        self._on_abort = on_abort
        self._blocked = [False] * num_channels
        self._closed = [False] * num_channels
        self._num_barriers = 0
        self._num_closed = 0
        self._current_id = -1
        self._buffered: list[_Event[T]] = []
        self._pending: deque[_Event[T]] = deque()

    # -- queries ------------------------------------------------------------------------------

    @property
    def num_channels(self) -> int:
        """Number of input channels."""
        return self._guard.num_channels

    @property
    def current_checkpoint_id(self) -> int:
        """Id of the checkpoint being aligned (or last triggered/aborted); ``-1`` before any."""
        return self._current_id

    @property
    def is_aligning(self) -> bool:
        """True while at least one barrier of the current checkpoint is in and it is pending."""
        return self._num_barriers > 0

    @property
    def has_pending(self) -> bool:
        """True if released input is still queued for replay (drain with ``release()``)."""
        return bool(self._pending)

    @property
    def num_buffered(self) -> int:
        """Number of events held back from blocked channels."""
        return len(self._buffered)

    def is_blocked(self, channel: int) -> bool:
        """True if the channel delivered the pending checkpoint's barrier (input is buffered)."""
        self._guard.check_range(channel)
        return self._blocked[channel]

    def is_closed(self, channel: int) -> bool:
        """True once the channel's end of partition has been processed (not merely buffered)."""
        self._guard.check_range(channel)
        return self._closed[channel]

    # -- input --------------------------------------------------------------------------------

    def process_element(self, channel: int, element: T) -> list[T]:
        """Offer a data element; returns the elements that may flow now (see class doc)."""
        self._guard.check_channel(channel)
        return self._offer(_Element(channel, element))

    def process_barrier(self, channel: int, checkpoint_id: int) -> list[T]:
        """Offer checkpoint barrier ``checkpoint_id`` from ``channel``."""
        self._guard.check_barrier(channel, checkpoint_id)
        return self._offer(_Barrier(channel, checkpoint_id))

    def process_cancellation(self, channel: int, checkpoint_id: int) -> list[T]:
        """Offer a cancellation marker (the upstream declined ``checkpoint_id``)."""
        self._guard.check_cancellation(channel, checkpoint_id)
        return self._offer(_Cancel(channel, checkpoint_id))

    def process_end_of_partition(self, channel: int) -> list[T]:
        """Offer the channel's end of partition; nothing may follow on that channel."""
        self._guard.end(channel)
        return self._offer(_EndOfPartition(channel))

    def release(self) -> list[T]:
        """Continue replaying released input; returns the next elements that may flow."""
        return self._drain()

    # -- internals ----------------------------------------------------------------------------

    def _offer(self, event: _Event[T]) -> list[T]:
        self._pending.append(event)
        return self._drain()

    def _drain(self) -> list[T]:
        out: list[T] = []
        pending = self._pending
        while pending:
            event = pending[0]
            if self._blocked[event.channel]:
                self._buffered.append(pending.popleft())
            elif isinstance(event, _Element):
                pending.popleft()
                out.append(event.element)
            elif out:
                # A control event may call back: deliver the elements before it first.
                break
            else:
                pending.popleft()
                if isinstance(event, _Barrier):
                    self._handle_barrier(event.channel, event.checkpoint_id)
                elif isinstance(event, _Cancel):
                    self._handle_cancellation(event.checkpoint_id)
                else:
                    self._handle_end_of_partition(event.channel)
        return out

    def _handle_barrier(self, channel: int, checkpoint_id: int) -> None:
        if self._num_barriers > 0:
            if checkpoint_id < self._current_id:
                return  # trailing barrier of an earlier, subsumed checkpoint
            if checkpoint_id > self._current_id:
                aborted = self._current_id
                self._release_blocks()
                self._on_abort(aborted, AbortReason.SUBSUMED)
                self._current_id = checkpoint_id
        elif checkpoint_id > self._current_id:
            self._current_id = checkpoint_id  # first barrier of a new checkpoint
        else:
            return  # aborted current checkpoint, or an older one
        self._blocked[channel] = True
        self._num_barriers += 1
        if self._num_barriers + self._num_closed == self.num_channels:
            self._release_blocks()
            self._on_checkpoint(checkpoint_id)

    def _handle_cancellation(self, checkpoint_id: int) -> None:
        if self._num_barriers > 0:
            if checkpoint_id == self._current_id:
                self._release_blocks()
                self._on_abort(checkpoint_id, AbortReason.CANCELLED)
            elif checkpoint_id > self._current_id:
                aborted = self._current_id
                self._release_blocks()
                self._current_id = checkpoint_id
                self._on_abort(aborted, AbortReason.SUBSUMED)
                self._on_abort(checkpoint_id, AbortReason.CANCELLED)
            # else: trailing marker of an older checkpoint
        elif checkpoint_id > self._current_id:
            # The first event of a new checkpoint is its cancellation: with the barrier count
            # at zero, its later barriers cannot start an alignment.
            self._current_id = checkpoint_id
            self._on_abort(checkpoint_id, AbortReason.CANCELLED)
        # else: trailing marker of an aborted or older checkpoint

    def _handle_end_of_partition(self, channel: int) -> None:
        self._closed[channel] = True
        self._num_closed += 1
        if self._num_barriers > 0:
            self._release_blocks()
            self._on_abort(self._current_id, AbortReason.END_OF_PARTITION)

    def _release_blocks(self) -> None:
        """Unblock all channels; buffered input goes to the front of the replay queue.

        Everything buffered was taken off the replay queue before what is still on it, so
        putting it in front keeps arrival order.
        """
        self._blocked = [False] * self.num_channels
        self._num_barriers = 0
        if self._buffered:
            self._pending.extendleft(reversed(self._buffered))
            self._buffered = []
