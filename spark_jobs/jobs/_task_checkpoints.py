"""The checkpoint side of a reader subtask (``ReaderTask`` inherits it): trigger, the
acknowledgement on the writer thread, complete and abort, as the checkpoint listener
delivers them.

Checkpoint *n* (``_on_trigger``, a priority mail on the mailbox thread): split states and
the source ranges the chain has not emitted, then the sink's pre-commit; the writer thread
closes the staged output and writes the acknowledgement while records keep flowing. Its
outcome comes back as a mail (``_acknowledged``): a failed acknowledgement fails the task.
``complete`` forgets the splits whose finished state it committed; the completion of the
checkpoint that carries the final snapshot ends the task (``abort`` of it asks for another).

Threading: every method runs on the mailbox thread, except ``_post_acknowledged`` (the
writer thread, which only hands a mail over) and ``_load_completed`` (blocking: at start or
on the writer thread).
"""

from __future__ import annotations

import contextlib
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import date, datetime

from sqlalchemy.engine import Engine

from spark_jobs.checkpoint import CheckpointListener
from spark_jobs.jobs._acknowledge import acknowledge_checkpoint
from spark_jobs.jobs._chain import OperatorChain
from spark_jobs.jobs._event_days import EventDays, load_completed, refresh_in_background
from spark_jobs.jobs._task_config import TaskConfig
from spark_jobs.jobs._task_state import TaskSplit, snapshot_splits
from spark_jobs.jobs._watermarks import TaskWatermarks
from spark_jobs.runtime import MailboxClosedError, MailboxExecutor, MailboxProcessor
from spark_jobs.sink import SinkWriter
from spark_jobs.source import SourceReaderBase

__all__ = ["TaskCheckpoints"]


class TaskCheckpoints:
    """Checkpoint handling of :class:`~._reader_task.ReaderTask` (see the module docstring);
    the attributes are the task's, set up by its ``__init__`` and ``_run``."""

    _config: TaskConfig
    _subtask: int
    _attempt: str
    _engine: Engine
    _io: ThreadPoolExecutor
    _sink: SinkWriter
    _chain: OperatorChain
    _reader: SourceReaderBase
    _listener: CheckpointListener
    _processor: MailboxProcessor
    _checkpoint_mails: MailboxExecutor
    _event_days: EventDays
    _watermarks: TaskWatermarks
    _splits: dict[int, TaskSplit]
    _input_ended: bool
    _stream_piece: bool
    _day_end: datetime | None
    _last_trigger: int
    _last_complete: int
    _acked: set[int]
    _final_acks: set[int]  # checkpoints that carry our final snapshot
    checkpoints_acked: int
    checkpoints_completed: int

    def _on_checkpoint_event(self, event: str, checkpoint_id: int) -> None:
        """From the listener (event loop = mailbox thread): handled as a priority mail —
        unless the task loop has ended (quiesced mailbox): a task that ended acknowledges
        nothing more, and if it failed, its error is the one that counts."""
        action = {
            "trigger": self._on_trigger,
            "complete": self._on_complete,
            "abort": self._on_abort,
        }[event]
        with contextlib.suppress(MailboxClosedError):
            self._checkpoint_mails.execute(lambda: action(checkpoint_id), f"checkpoint {event}")

    def _on_trigger(self, checkpoint_id: int) -> None:
        if checkpoint_id <= self._last_trigger:
            return  # repeated (notification and poll both delivered it)
        self._last_trigger = checkpoint_id
        final = self._input_ended and self._chain.in_flight() == 0
        # Steps 1-2: split states and the source ranges the chain has not emitted.
        states = snapshot_splits(
            self._splits,
            self._chain.pending(),
            checkpoint_id,
            max_attempts=self._config.split_max_attempts,
        )
        # Step 3: the sink's pre-commit; the writer thread closes the staged output, then
        # writes the acknowledgement (asynchronous part, off the mailbox thread).
        staged = self._sink.pre_commit()
        # The interval's counts per output partition: exactly what this pre-commit staged.
        partitions = self._event_days.take()
        if final:
            self._final_acks.add(checkpoint_id)
        # "watermark" (the sink-side task watermark), "finished", "stream", "day_end" and "idle"
        # are what partition completeness reads: specified on ``Acknowledgement.snapshot``.
        snapshot = {
            "splits": states,
            "attempt": self._attempt,
            "watermark": self._watermarks.sink_watermark(),
            "finished": final,
            "stream": self._stream_piece,
            "day_end": None if self._day_end is None else self._day_end.isoformat(),
            "idle": self._reader.is_idle() and self._chain.in_flight() == 0,
        }
        done = self._io.submit(
            acknowledge_checkpoint,
            self._engine,
            self._config,
            self._subtask,
            self._attempt,
            checkpoint_id,
            final,
            snapshot,
            staged,
            partitions,
        )
        done.add_done_callback(lambda f: self._post_acknowledged(f, checkpoint_id, final))

    def _post_acknowledged(self, future: Future[None], checkpoint_id: int, final: bool) -> None:
        """(Writer thread.) Hand the acknowledgement's outcome to the mailbox — unless the
        task has ended meanwhile (it failed: its error is the one that counts, and a
        traceback about the dropped mail would only bury it)."""
        with contextlib.suppress(MailboxClosedError):
            self._checkpoint_mails.execute(
                lambda: self._acknowledged(future, checkpoint_id, final), "checkpoint acknowledged"
            )

    def _acknowledged(self, future: Future[None], checkpoint_id: int, final: bool) -> None:
        future.result()  # a failed acknowledgement fails the task (Spark retries it)
        self.checkpoints_acked += 1
        self._acked.add(checkpoint_id)
        if not self._config.exactly_once:
            # AT_LEAST_ONCE: the acknowledgement committed this subtask's snapshot itself.
            self._forget_finished(checkpoint_id)
            if final:
                self._processor.all_actions_completed()

    def _on_complete(self, checkpoint_id: int) -> None:
        if checkpoint_id <= self._last_complete:
            return
        self._last_complete = checkpoint_id
        self._listener.forget_before(checkpoint_id)
        if checkpoint_id not in self._acked:
            return  # completed with another attempt's snapshot, or before we joined
        self.checkpoints_completed += 1
        self._forget_finished(checkpoint_id)
        if checkpoint_id not in self._final_acks and self._config.plan.source.partitioned:
            refresh_in_background(
                self._event_days, self._io, self._checkpoint_mails, self._load_completed
            )
        if checkpoint_id in self._final_acks:
            self._listener.wants_checkpoint = False
            self._processor.all_actions_completed()

    def _on_abort(self, checkpoint_id: int) -> None:
        if checkpoint_id in self._final_acks:
            self._listener.request_checkpoint()  # the next one carries the final snapshot

    def _load_completed(self) -> frozenset[date]:
        """Blocking: at start, or on the writer thread."""
        partitioned = self._config.plan.source.partitioned
        return load_completed(self._engine, self._config.source) if partitioned else frozenset()

    def _forget_finished(self, checkpoint_id: int) -> None:
        """Splits whose finished state is committed are no longer this subtask's state."""
        for split_id in [
            split_id
            for split_id, held in self._splits.items()
            if held.finished_in is not None and held.finished_in <= checkpoint_id
        ]:
            del self._splits[split_id]
