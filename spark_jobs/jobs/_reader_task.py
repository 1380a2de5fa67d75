"""One reader subtask: source reader → the pipeline's steps → sink, on one mailbox.

Runs inside a Spark task (a Python worker). The thread calling :func:`run_reader_subtask`
becomes the mailbox thread: it runs the asyncio loop on which the mailbox, every step's
operator, the lookups' connections, the checkpoint listener and all operator state live. The
split fetcher and the sink's writer thread are the only other threads; they talk to the
mailbox thread through the hand-off queue and mails.

Records travel in batches: the fetcher parses a block of records of one split (any format,
the pipeline's declared schema); the block enters the operator chain (``_chain``), one stage
per step, and what leaves the last stage goes to the sink.

Checkpoint *n* (``_task_checkpoints``, which this task inherits; a priority mail): the
synchronous part runs on the mailbox thread between two blocks — split states (offsets,
watermarks), the source ranges the chain has not emitted, the sink's pre-commit — and the
asynchronous part (closing staged output, the acknowledgement transaction) on the writer
thread while records keep flowing. The subtask ends only when a checkpoint taken after its
input ended has completed.

Event time (``_watermarks``): when the source declares an event-time field, the task
watermark enters the chain as ``Watermark`` markers after the blocks it bounds — never
while restored ranges are still being re-read (their records were in flight at the
checkpoint, behind the restored split watermarks) — and the last one that reached the sink
is part of every snapshot.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import date, datetime

import pyarrow as pa
import pyarrow.compute as pc

from enumerator_service import (
    STREAM_SOURCE_KINDS,
    CheckpointStore,
    SplitAssignment,
    SplitState,
    SplitStore,
    committed_task_watermark,
    partition_end,
)
from spark_jobs.async_io import Watermark
from spark_jobs.checkpoint import CheckpointListener
from spark_jobs.jobs._build import build_stages
from spark_jobs.jobs._chain import OperatorChain
from spark_jobs.jobs._event_days import EventDays
from spark_jobs.jobs._outages import connect_when_up
from spark_jobs.jobs._results import SubtaskResult
from spark_jobs.jobs._source_reader import open_source_reader
from spark_jobs.jobs._task_checkpoints import TaskCheckpoints
from spark_jobs.jobs._task_config import TaskConfig
from spark_jobs.jobs._task_state import TaskSplit, decode_pending
from spark_jobs.jobs._user_errors import UserCodeError
from spark_jobs.jobs._watermarks import TaskWatermarks
from spark_jobs.runtime import (
    MailboxController,
    MailboxProcessor,
    Suspension,
)
from spark_jobs.runtime._timers import AsyncioTimerService
from spark_jobs.sink import open_sink_writer
from spark_jobs.source import InputStatus, ParsedBlock
from spark_jobs.source._batch import OFFSET, Batch, DeadLetter
from spark_jobs.source._poison import SplitFailure

__all__ = ["ReaderTask"]

#: Blocks the default action moves per call before letting I/O callbacks run.
_SLICE = 512
#: Checkpoint mails overtake input and I/O completions, but not "resume input" (MAX_PRIORITY).
CHECKPOINT_PRIORITY = 1 << 20


def _resume_on(suspension: Suspension) -> Callable[[Future[None]], None]:
    """Future callback resuming the default action (from whichever thread completes it)."""
    return lambda _future: suspension.resume()


class ReaderTask(TaskCheckpoints):
    def __init__(self, config: TaskConfig, subtask: int) -> None:
        self._config = config
        self._subtask = subtask
        self._attempt = uuid.uuid4().hex[:8]
        self._splits: dict[int, TaskSplit] = {}
        self._partitions: dict[int, str] = {}  # split → sink partition (kept after the split)
        self._uris: dict[int, str] = {}  # split → its file or table range (to name errors)
        self._input_ended = False
        #: A split of this run was a piece of a stream that goes on (a Kafka partition's or a
        #: slot's offsets up to the run's bound, a CDC snapshot chunk): the end of this
        #: subtask's input is not the end of the source's (its final snapshot says so).
        self._stream_piece = False
        #: The end of the latest day of the Kafka day splits it read (a day split holds its
        #: day's whole time range: read, the day is done), or None.
        self._day_end: datetime | None = None
        self._last_trigger = 0
        self._last_complete = 0
        self._acked: set[int] = set()
        self._final_acks: set[int] = set()  # checkpoints that carry our final snapshot
        self.checkpoints_acked = 0
        self.checkpoints_completed = 0

    async def run(self) -> SubtaskResult:
        try:
            return await self._run()
        except UserCodeError as exc:
            # Named here, where the splits' files are known (the chain knows only ids).
            exc.named(self._config.source, self._uris.get(exc.split_id or -1))
            raise

    async def _run(self) -> SubtaskResult:
        config = self._config
        plan = config.plan
        self._engine = engine = await connect_when_up(config.database_url)
        store = SplitStore(engine)
        # A retried attempt of a subtask whose final snapshot was already committed (its
        # worker died after the checkpoint completed): nothing is left to do, and the
        # coordinator, for which the subtask is a closed channel, would never trigger a
        # checkpoint for it again.
        if CheckpointStore(engine, config.run_id, {}).finished(self._subtask):
            engine.dispose()
            return SubtaskResult(self._subtask, self._attempt, 0, 0, 0)
        source = plan.source
        self._event_days = EventDays(
            source.event_time,
            by_event_day=source.event_day_partitions,
            policy=source.late_records,
            completed=self._load_completed(),
        )
        self._processor = processor = MailboxProcessor(self._default_action, debug=config.debug)
        self._checkpoint_mails = processor.executor(CHECKPOINT_PRIORITY)
        self._chain = OperatorChain(build_stages(config, processor), self)
        self._watermarks = TaskWatermarks(self._chain.push_watermark, self._task_watermark)
        self._event_time = plan.source.event_time is not None
        # The sink's writer thread: staged output and acknowledgements, in submission order.
        self._io = ThreadPoolExecutor(1, thread_name_prefix=f"sink-writer-{self._subtask}")
        self._sink = open_sink_writer(
            plan.sink,
            self._io,
            schema=plan.output_schema(),
            partitioned=plan.source.partitioned,
            dsn=config.asyncpg_dsn,
            staging_root=config.folder(config.staging_root),
            output_root=config.folder(config.output_root),
            run_id=config.run_id,
            subtask=self._subtask,
            attempt=self._attempt,
        )
        self._listener = CheckpointListener(
            config.asyncpg_dsn,
            config.run_id,
            self._subtask,
            self._on_checkpoint_event,
            poll_interval=config.checkpoint_poll_seconds,
        )
        self._reader = open_source_reader(config, self._subtask, store)
        await self._chain.open()
        await self._listener.open()
        self._reader.start()
        if self._event_time:
            self._watermarks.resume(committed_task_watermark(engine, config.run_id, self._subtask))
            self._watermarks.start(AsyncioTimerService(processor.executor()))
        try:
            await processor.run_loop()
        finally:
            self._watermarks.stop()
            self._reader.close()
            if not self._final_acks:
                self._io.submit(self._sink.abort)  # in-progress output will never commit
            self._io.submit(self._sink.close)
            self._io.shutdown(wait=True)
            await self._listener.close()
            await self._chain.close()
            engine.dispose()
        return SubtaskResult(
            subtask=self._subtask,
            attempt=self._attempt,
            rows_written=self._sink.rows_written,
            checkpoints_acked=self.checkpoints_acked,
            checkpoints_completed=self.checkpoints_completed,
            steps=tuple(self._chain.metrics()),
        )

    # -- default action: move input into the chain --------------------------------------

    def _default_action(self, controller: MailboxController) -> None:
        chain, reader = self._chain, self._reader
        for _ in range(_SLICE):
            if not chain.has_capacity():
                chain.notify_when_available(controller.suspend_default_action().resume)
                return
            status = reader.poll_next(self)
            if status is InputStatus.MORE_AVAILABLE:
                if self._event_time:
                    self._watermarks.offer()
                continue
            suspension = controller.suspend_default_action()
            if status is InputStatus.NOTHING_AVAILABLE:
                if self._event_time:
                    self._watermarks.offer(force=True)  # input pauses: the advance goes now
                reader.is_available().add_done_callback(_resume_on(suspension))
                return
            # END_OF_INPUT: stay suspended; once everything is emitted, ask for the final
            # checkpoint — the subtask ends when one taken after this point completes.
            self._input_ended = True
            self._watermarks.stop()  # the final snapshot says "finished" (+infinity)
            chain.notify_when_drained(self._listener.request_checkpoint)
            return

    # -- watermarks (mailbox thread) ----------------------------------------------------

    def _task_watermark(self) -> datetime | None:
        if any(held.replay for held in self._splits.values()):
            return None  # restored ranges (behind the restored split watermarks) go first
        return self._reader.watermark()

    # -- ReaderOutput (mailbox thread) ---------------------------------------------------

    def split_added(self, assignment: SplitAssignment, state: SplitState) -> None:
        split_id = assignment.split_id
        held = self._splits[split_id] = TaskSplit(assignment, state)
        split = assignment.split
        if split.kind in STREAM_SOURCE_KINDS:
            self._stream_piece = True
            if split.partition_key is not None:  # a day split: up to its day's end
                end = partition_end(split.partition_key)
                self._day_end = end if self._day_end is None else max(self._day_end, end)
        self._uris[split_id] = assignment.split.path
        # Restore: the ranges in flight at the committed checkpoint are read again first (by
        # the split's reader, as replay blocks) and run through the whole chain again.
        ranges = decode_pending(split_id, assignment.pending)
        held.replay = dict(enumerate(ranges))
        # (Also checks that the sink can take the split, e.g. a rebuild needs an upsert key.)
        landing_day = assignment.split.partition_key
        self._partitions[split_id] = self._sink.output_partition(
            assignment.rebuild_day or landing_day, assignment.rebuild_id
        )
        self._event_days.split_added(
            split_id,
            landing_day,
            assignment.rebuild_id,
            assignment.rebuild_day,
            fresh=assignment.rebuild_fresh,
        )

    def collect_block(self, block: ParsedBlock) -> None:
        rows, only = block.rows, None
        held = self._splits[block.split_id]
        if block.replay:
            entry = held.replayed(block.replay_entry, block.end)
            if entry is not None and entry.only is not None:
                # Only some records of this range were pending (a per-record step's).
                wanted = [o for o in entry.only if block.start <= o < block.end]
                rows = rows.filter(pc.is_in(rows.column(OFFSET), pa.array(wanted, pa.int64())))
                only = tuple(wanted)
        else:
            held.replay.clear()  # the split's own reading began: every range was re-read
        if rows.num_rows:  # (a block of only blank lines or dead letters has none)
            self._chain.push(Batch(block.split_id, rows, (block.start, block.end), only=only))

    def dead_letter(
        self, split_id: int, offset: int, raw: bytes, reason: str, day: date | None = None
    ) -> None:
        # The input did not parse: on the landing day, else on the day the reader gave it.
        counted = self._event_days.count_dead_letter(split_id, offset, read_day=day)
        self._dead_letter(counted, split_id, offset, raw, reason)

    def split_finished(self, split_id: int, state: SplitState) -> None:
        held = self._splits[split_id]
        self._event_days.touch(split_id)
        held.reading_done = True
        held.replay.clear()
        if self._event_time:
            self._watermarks.offer(force=True)  # the split's last advance, before it leaves

    def split_failed(self, failure: SplitFailure, state: SplitState) -> None:
        # A poison split's failed attempt: dropped here; the next checkpoint that finds none
        # of its records in the chain carries the failure (its output so far commits with it).
        held = self._splits[failure.split_id]
        held.reading_done = True
        held.failure = failure

    # -- ChainSink (mailbox thread) ------------------------------------------------------

    def write(self, batch: Batch) -> None:
        if batch.rows.num_rows:
            self._event_days.write(self._sink, batch.rows, batch.split_id)

    def dead_letters(self, split_id: int, dead: list[DeadLetter]) -> None:
        for offset, raw, reason in dead:  # a step's: on its record's event day (in ``raw``)
            counted = self._event_days.count_dead_letter(split_id, offset, raw)
            self._dead_letter(counted, split_id, offset, raw, reason)

    def _dead_letter(
        self, counted: bool, split_id: int, offset: int, raw: bytes, reason: str
    ) -> None:
        # Not counted: a rebuild member's dead letter of another day stays as first written.
        if counted:
            self._sink.dead_letter(split_id, offset, raw, reason)
        else:
            self._sink.count_dropped(1)

    def count_dropped(self, records: int) -> None:
        self._sink.count_dropped(records)

    def watermark(self, marker: Watermark) -> None:
        self._watermarks.reached_sink(marker)
