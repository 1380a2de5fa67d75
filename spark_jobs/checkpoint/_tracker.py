"""AT_LEAST_ONCE barrier tracking (Flink's ``BarrierTracker``), generic over int channels.

Threading: every method runs on the mailbox thread only. The tracker is not thread-safe and
never blocks a channel.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from spark_jobs.checkpoint._common import (
    AbortCallback,
    AbortReason,
    ChannelGuard,
    CheckpointCallback,
)

__all__ = ["MAX_CHECKPOINTS_TO_TRACK", "BarrierTracker"]

T = TypeVar("T")

#: How many pending checkpoints are tracked at most; beyond it the oldest is dropped.
MAX_CHECKPOINTS_TO_TRACK = 50


@dataclass(slots=True)
class _PendingCheckpoint:
    checkpoint_id: int
    channels: set[int] = field(default_factory=set)
    aborted: bool = False


class BarrierTracker(Generic[T]):
    """Tracks checkpoint barriers over ``num_channels`` input channels without blocking.

    Semantics (Flink's ``BarrierTracker``, AT_LEAST_ONCE):

    * Elements always flow (``process_element`` returns ``[element]``); nothing is buffered.
    * With exactly one channel every barrier triggers ``on_checkpoint`` at once.
    * Otherwise pending checkpoints form a queue ordered by id, each with the set of channels
      whose barrier arrived. When every open channel delivered *n*, ``on_checkpoint(n)`` is
      called and *n* and every older pending checkpoint are removed (subsumed, silently).
    * The first barrier of an id not pending starts tracking it only if the id is newer than
      the latest pending one; otherwise it is dropped (that checkpoint cannot complete).
      At most ``max_pending`` checkpoints are tracked; beyond that the oldest is dropped.
    * A cancellation marker aborts its checkpoint once (``on_abort(n, CANCELLED)``) and every
      older pending one (``SUBSUMED``). The aborted entry keeps counting barriers until all
      arrived, so its late barriers neither trigger nor restart it.
    * End of partition removes the channel from the open set; pending checkpoints that every
      remaining open channel delivered complete (each triggers, in id order).
    * A repeated barrier on one channel raises ``StreamCorruptError``.

    Callbacks run synchronously inside the ``process_*`` call and must not call back into the
    tracker. Threading: mailbox thread only.
    """

    def __init__(
        self,
        num_channels: int,
        on_checkpoint: CheckpointCallback,
        on_abort: AbortCallback,
        max_pending: int = MAX_CHECKPOINTS_TO_TRACK,
    ) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        self._guard = ChannelGuard(num_channels)
        self._on_checkpoint = on_checkpoint
        self._on_abort = on_abort
        self._max_pending = max_pending
        self._open = set(range(num_channels))
        self._pending: deque[_PendingCheckpoint] = deque()
        self._latest_pending_id = -1

    # -- queries ------------------------------------------------------------------------------

    @property
    def num_channels(self) -> int:
        """Number of input channels (open or closed)."""
        return self._guard.num_channels

    @property
    def num_open_channels(self) -> int:
        """Channels whose end of partition has not arrived."""
        return len(self._open)

    @property
    def pending_checkpoint_ids(self) -> list[int]:
        """Ids of the tracked pending checkpoints, oldest first (aborted ones included)."""
        return [p.checkpoint_id for p in self._pending]

    @property
    def latest_pending_checkpoint_id(self) -> int:
        """The newest id ever tracked; ``-1`` before any."""
        return self._latest_pending_id

    def is_blocked(self, channel: int) -> bool:
        """Always False: the tracker never blocks (present for parity with alignment)."""
        self._guard.check_range(channel)
        return False

    # -- input --------------------------------------------------------------------------------

    def process_element(self, channel: int, element: T) -> list[T]:
        """Offer a data element; it always flows at once."""
        self._guard.check_channel(channel)
        return [element]

    def process_barrier(self, channel: int, checkpoint_id: int) -> list[T]:
        """Offer checkpoint barrier ``checkpoint_id`` from ``channel``; returns ``[]``."""
        self._guard.check_barrier(channel, checkpoint_id)
        if self.num_channels == 1:
            self._on_checkpoint(checkpoint_id)
            return []
        pos = self._find(checkpoint_id)
        if pos is None:
            if checkpoint_id <= self._latest_pending_id:
                return []  # cannot complete any more: an older id than the latest pending
            self._latest_pending_id = checkpoint_id
            self._pending.append(_PendingCheckpoint(checkpoint_id))
            if len(self._pending) > self._max_pending:
                self._pending.popleft()
            pos = len(self._pending) - 1
        entry = self._pending[pos]
        entry.channels.add(channel)
        if self._open <= entry.channels:
            for _ in range(pos + 1):
                self._pending.popleft()
            if not entry.aborted:
                self._on_checkpoint(checkpoint_id)
        return []

    def process_cancellation(self, channel: int, checkpoint_id: int) -> list[T]:
        """Offer a cancellation marker for ``checkpoint_id`` from ``channel``; returns ``[]``."""
        self._guard.check_cancellation(channel, checkpoint_id)
        if self.num_channels == 1:
            self._on_abort(checkpoint_id, AbortReason.CANCELLED)
            return []
        while self._pending and self._pending[0].checkpoint_id < checkpoint_id:
            older = self._pending.popleft()
            if not older.aborted:
                self._on_abort(older.checkpoint_id, AbortReason.SUBSUMED)
        if self._pending and self._pending[0].checkpoint_id == checkpoint_id:
            entry = self._pending[0]
        elif checkpoint_id > self._latest_pending_id:
            self._latest_pending_id = checkpoint_id
            entry = _PendingCheckpoint(checkpoint_id)
            self._pending.appendleft(entry)  # everything older was just removed
        else:
            return []  # trailing marker of a checkpoint already aborted or dropped
        if not entry.aborted:
            entry.aborted = True
            self._on_abort(checkpoint_id, AbortReason.CANCELLED)
        entry.channels.add(channel)
        if self._open <= entry.channels:
            self._pending.popleft()  # all markers/barriers seen: forget it
        return []

    def process_end_of_partition(self, channel: int) -> list[T]:
        """Close ``channel``; pending checkpoints all remaining channels delivered complete."""
        self._guard.end(channel)
        self._open.discard(channel)
        last = -1
        for i, entry in enumerate(self._pending):
            if self._open <= entry.channels:
                last = i
        for _ in range(last + 1):
            entry = self._pending.popleft()
            if not entry.aborted and self._open <= entry.channels:
                self._on_checkpoint(entry.checkpoint_id)
        return []

    def _find(self, checkpoint_id: int) -> int | None:
        for i, entry in enumerate(self._pending):
            if entry.checkpoint_id == checkpoint_id:
                return i
        return None
