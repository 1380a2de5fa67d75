"""The operator chain of a task: reader → step 1 → … → step n → sink, on one mailbox thread.

Between two stages sits a *boundary*: a batch leaving a stage first hands that stage's dead
letters and dropped-record count to the sink (so they are part of the next pre-commit, like
the records before them), then enters the next stage (or the sink). ``Watermark`` markers
take the same path (:meth:`OperatorChain.push_watermark`): each stage forwards one only after
every record that entered before it (see ``_stages``), and the sink sees it last
(``ChainSink.watermark``).

Back-pressure: input is offered only while every stage has capacity; a full stage keeps what
its upstream still emits in its backlog (bounded by the upstream's capacity), and the task's
default action waits for :meth:`notify_when_available`. End of input waits until every stage
is drained (:meth:`notify_when_drained`).

A checkpoint stores :meth:`pending` — the source ranges of every element any stage has not
emitted — and restore reads them again and pushes them through the whole chain: every step
runs again for them (a step's results reach the sink once, because an element is emitted by
the last stage once).

Threading: mailbox thread only; never blocks.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Protocol

from spark_jobs.async_io import Watermark
from spark_jobs.jobs._results import StepMetrics
from spark_jobs.jobs._stages import PendingRange, Stage
from spark_jobs.source._batch import Batch, DeadLetter

__all__ = ["ChainSink", "OperatorChain"]


class ChainSink(Protocol):
    """Where the chain ends (implemented by the task)."""

    def write(self, batch: Batch) -> None: ...
    def dead_letters(self, split_id: int, dead: list[DeadLetter]) -> None: ...
    def count_dropped(self, records: int) -> None: ...
    def watermark(self, marker: Watermark) -> None:
        """A watermark reached the end of the chain: every record before it was written."""


class OperatorChain:
    def __init__(self, stages: Sequence[Stage], sink: ChainSink) -> None:
        self._stages = list(stages)
        self._sink = sink
        for index, stage in enumerate(self._stages):
            stage.downstream = functools.partial(self._boundary, index + 1)
            stage.downstream_marker = functools.partial(self._marker_boundary, index + 1)

    @property
    def stages(self) -> list[Stage]:
        return self._stages

    async def open(self) -> None:
        for stage in self._stages:
            await stage.open()

    async def close(self) -> None:
        for stage in self._stages:
            await stage.close()

    def push(self, batch: Batch) -> None:
        """Input from the reader (or a restore)."""
        self._boundary(0, batch)

    def push_watermark(self, marker: Watermark) -> None:
        """A watermark from the reader, after every batch it bounds was pushed."""
        self._marker_boundary(0, marker)

    def _marker_boundary(self, index: int, marker: Watermark) -> None:
        if index < len(self._stages):
            self._stages[index].process_marker(marker)
        else:
            self._sink.watermark(marker)

    def _boundary(self, index: int, batch: Batch) -> None:
        if batch.dead:
            self._sink.dead_letters(batch.split_id, batch.dead)
            batch.dead = []
        if batch.dropped:
            self._sink.count_dropped(batch.dropped)
            batch.dropped = 0
        if index < len(self._stages):
            self._stages[index].process(batch)
        else:
            self._sink.write(batch)

    # -- flow control --------------------------------------------------------------------

    def has_capacity(self) -> bool:
        return all(stage.has_capacity() for stage in self._stages)

    def notify_when_available(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once every stage has capacity (at once if they have)."""
        for stage in self._stages:
            if not stage.has_capacity():
                stage.notify_when_available(lambda: self.notify_when_available(callback))
                return
        callback()

    def in_flight(self) -> int:
        return sum(stage.in_flight() for stage in self._stages)

    def notify_when_drained(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once no stage holds anything (at once if none does)."""
        for stage in self._stages:
            if stage.in_flight():
                stage.notify_when_drained(lambda: self.notify_when_drained(callback))
                return
        callback()

    # -- checkpoints and metrics ---------------------------------------------------------

    def pending(self) -> list[PendingRange]:
        return [entry for stage in self._stages for entry in stage.pending()]

    def metrics(self) -> list[StepMetrics]:
        return [stage.metrics() for stage in self._stages]
