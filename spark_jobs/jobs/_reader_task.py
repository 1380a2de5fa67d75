"""One reader subtask: source reader → async lookup operator → sink, on one mailbox.

Runs inside a Spark task (a Python worker). The thread calling :func:`run_reader_subtask`
becomes the mailbox thread: it runs the asyncio loop on which the mailbox, the asyncpg lookups,
the checkpoint listener and all operator state live. The split fetcher and the sink's writer
thread are the only other threads; they talk to the mailbox thread through the hand-off queue
and mails.

Records travel in batches: the async operator's element is an ``EventBatch`` (a parsed block
of JSON Lines from the fetcher, or the events of other formats collected during one run of
the default action), looked up with one query per batch (``ArrowBatchLookup``) and handed to
the sink as an Arrow record batch.

Checkpoint *n* (``_on_trigger``, a priority mail): the synchronous part runs on the mailbox
thread between two records — split states (offsets, watermarks), the async operator's inputs
not yet emitted, the sink's pre-commit — and the asynchronous part (closing staged files, the
acknowledgement transaction) on the writer thread while records keep flowing. The subtask
ends only when a checkpoint taken after its input ended has completed.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa

from enumerator_service import (
    Acknowledgement,
    SplitAssignment,
    SplitState,
    SplitStore,
    acknowledge,
)
from spark_jobs.async_io import (
    NO_RETRY,
    AsyncWaitOperator,
    Marker,
    Output,
    OutputMode,
    exponential_backoff,
)
from spark_jobs.checkpoint import CheckpointListener
from spark_jobs.jobs._outages import connect_when_up, is_transient
from spark_jobs.jobs._task_config import TaskConfig
from spark_jobs.jobs._task_state import (
    EventBatch,
    TaskSplit,
    batch_of_events,
    decode_pending,
    snapshot_splits,
)
from spark_jobs.lookup import ArrowBatchLookup, LookupCache
from spark_jobs.runtime import MailboxController, MailboxProcessor, Suspension
from spark_jobs.sink import (
    ENRICHED_SCHEMA,
    SINK_NAME,
    StagedOutput,
    committer,
    open_sink_writer,
    publish_files,
)
from spark_jobs.source import (
    Event,
    EventBlock,
    FormatRouter,
    HandoffQueue,
    InputStatus,
    RawLine,
    RecordEmitter,
    SourceReaderBase,
    SplitFetcher,
    read_span,
)

__all__ = ["ReaderTask", "TaskConfig"]

#: Elements the default action moves per call before letting I/O callbacks run.
_SLICE = 512
_USER_COLUMNS = ("name", "country", "tier", "signup_time")
_USER_TYPES = [field.type for field in ENRICHED_SCHEMA][5:]
#: Events of record-at-a-time formats per operator element (at most: a run of the default
#: action flushes what it collected).
_EVENTS_PER_BATCH = 2048


#: Checkpoint mails overtake input and I/O completions, but not "resume input" (MAX_PRIORITY).
CHECKPOINT_PRIORITY = 1 << 20


def _resume_on(suspension: Suspension) -> Callable[[Future[None]], None]:
    """Future callback resuming the default action (from whichever thread completes it)."""
    return lambda _future: suspension.resume()


def _join(batch: EventBatch, rows: Any, users: list[Any]) -> EventBatch:
    """The enriched rows of ``batch`` (as an EventBatch of the same split)."""
    enriched = pa.RecordBatch.from_arrays([*rows.columns, *users], schema=ENRICHED_SCHEMA)
    return EventBatch(batch.split_id, enriched)


class ReaderTask:
    def __init__(self, config: TaskConfig, subtask: int) -> None:
        self._config = config
        self._subtask = subtask
        self._attempt = uuid.uuid4().hex[:8]
        self._splits: dict[int, TaskSplit] = {}
        self._days: dict[int, str] = {}  # split → sink partition (kept after the split)
        # Events of record-at-a-time formats not yet handed to the operator; empty between
        # two runs of the default action (so never at a checkpoint).
        self._events: dict[int, list[Event]] = defaultdict(list)
        self._input_ended = False
        self._last_trigger = 0
        self._last_complete = 0
        self._acked: set[int] = set()
        self._final_acks: set[int] = set()  # checkpoints that carry our final snapshot
        self.checkpoints_acked = 0
        self.checkpoints_completed = 0

    async def run(self) -> dict[str, Any]:
        config = self._config
        self._engine = engine = await connect_when_up(config.database_url)
        store = SplitStore(engine)
        self._processor = processor = MailboxProcessor(self._default_action, debug=config.debug)
        self._checkpoint_mails = processor.executor(CHECKPOINT_PRIORITY)
        lookup: ArrowBatchLookup[EventBatch, EventBatch] = ArrowBatchLookup(
            config.asyncpg_dsn,
            schema=config.lookup_schema,
            table=config.lookup_table,
            key_column=config.lookup_key,
            columns=_USER_COLUMNS,
            types=_USER_TYPES,
            key_field="user_id",
            rows_of=lambda batch: batch.rows,
            load=EventBatch.loaded,
            joiner=_join,
            max_batch_size=config.batch_size,
            pool_size=config.pool_size,
            # Below the operator's timeout, so a retry re-queries instead of waiting.
            query_timeout=config.timeout_seconds / (config.retries + 2),
            cache=LookupCache(config.cache_rows, expire_after_write=config.cache_ttl_seconds)
            if config.cache_rows
            else None,
            latency=config.injected_latency_ms / 1000,
        )
        # Transient database errors (a dropped connection, a restart) are retried.
        retry = (
            exponential_backoff(config.retries, 0.1, 5.0, on_exception=is_transient)
            if config.retries
            else NO_RETRY
        )
        self._operator = AsyncWaitOperator(
            lookup,
            Output(self._collect_enriched, self._on_marker),
            processor,
            capacity=config.capacity,
            mode=OutputMode.ORDERED,
            timeout=config.timeout_seconds,
            retry=retry,
        )
        # The sink's writer thread: staged output and acknowledgements, in submission order.
        self._io = ThreadPoolExecutor(1, thread_name_prefix=f"sink-writer-{self._subtask}")
        self._sink = open_sink_writer(
            config.sink,
            self._io,
            dsn=config.asyncpg_dsn,
            schema=config.sink_schema,
            table=config.sink_table,
            staging_root=Path(config.staging_root),
            output_root=Path(config.output_root),
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
        handoff = HandoffQueue(capacity=4)
        # A retried attempt first restores the splits its predecessor held (new epoch).
        restored = store.reclaim(config.run_id, self._subtask, config.lease_seconds)
        router = FormatRouter(
            max_line_bytes=config.max_line_bytes,
            dsn=config.asyncpg_dsn,
            block_bytes=config.block_bytes,
        )
        fetcher = SplitFetcher(
            router,
            handoff,
            lambda: store.pull_next(config.run_id, self._subtask, config.lease_seconds),
            restored,
            name=f"split-fetcher-{self._subtask}",
            poll_interval=config.continuous_poll_seconds if config.continuous else None,
            idle_exit=config.continuous_idle_seconds,
        )
        self._reader = SourceReaderBase(fetcher, handoff, RecordEmitter(router))
        await self._operator.open()
        await self._listener.open()
        self._reader.start()
        try:
            await processor.run_loop()
        finally:
            self._reader.close()
            if not self._final_acks:
                self._io.submit(self._sink.abort)  # in-progress output will never commit
            self._io.submit(self._sink.close)
            self._io.shutdown(wait=True)
            await self._listener.close()
            await self._operator.close()
            engine.dispose()
        metrics = lookup.metrics()
        return {
            "subtask": self._subtask,
            "attempt": self._attempt,
            "rows_written": self._sink.rows_written,
            "checkpoints_acked": self.checkpoints_acked,
            "checkpoints_completed": self.checkpoints_completed,
            "lookups": metrics.lookups,
            "lookup_batches": metrics.batches,
            "lookup_keys_queried": metrics.keys_queried,
            "cache_hits": metrics.cache_hits,
            "lookup_p50_ms": metrics.p50_ms,
            "lookup_p99_ms": metrics.p99_ms,
            "lookup_retries": self._operator.retries,
        }

    # -- default action: move input into the async operator -----------------------------

    def _default_action(self, controller: MailboxController) -> None:
        operator, reader = self._operator, self._reader
        for _ in range(_SLICE):
            if not operator.has_capacity():
                self._flush_events()
                operator.notify_when_available(controller.suspend_default_action().resume)
                return
            status = reader.poll_next(self)
            if status is InputStatus.MORE_AVAILABLE:
                continue
            self._flush_events()
            suspension = controller.suspend_default_action()
            if status is InputStatus.NOTHING_AVAILABLE:
                reader.is_available().add_done_callback(_resume_on(suspension))
                return
            # END_OF_INPUT: stay suspended; once everything is emitted, ask for the final
            # checkpoint — the subtask ends when one taken after this point completes.
            self._input_ended = True
            operator.notify_when_drained(self._listener.request_checkpoint)
            return
        self._flush_events()

    def _flush_events(self) -> None:
        """Hand collected events of record-at-a-time formats to the operator (one batch per
        split). Their splits' offsets already moved past them, so they must be operator
        input before the mailbox runs anything else (a checkpoint snapshots the operator)."""
        if self._events:
            events, self._events = self._events, defaultdict(list)
            for split_id, collected in events.items():
                self._operator.process_element(batch_of_events(split_id, collected))

    # -- ReaderOutput (mailbox thread) ---------------------------------------------------

    def split_added(self, assignment: SplitAssignment, state: SplitState) -> None:
        split_id = assignment.split_id
        self._splits[split_id] = TaskSplit(assignment, state)
        self._days[split_id] = self._sink.output_partition(
            assignment.split.partition_key, assignment.rebuild_id
        )

        # Restore: the inputs in flight at the committed checkpoint are invoked again, ahead
        # of the records after the split's resume offset (the operator backlogs when full).
        # Blocks come back as byte ranges, read by the lookup on an executor thread.
        def load_span(start: int, end: int) -> pa.RecordBatch:
            return read_span(assignment, start, end, self._config.max_line_bytes)

        for batch in decode_pending(split_id, assignment.pending, load_span):
            self._operator.process_element(batch)

    def collect(self, event: Event, timestamp: int) -> None:
        collected = self._events[event.split_id]
        collected.append(event)
        if len(collected) >= _EVENTS_PER_BATCH:
            del self._events[event.split_id]
            self._operator.process_element(batch_of_events(event.split_id, collected))

    def collect_block(self, block: EventBlock) -> None:
        self._operator.process_element(
            EventBatch(block.split_id, block.rows, (block.start, block.end))
        )

    def dead_letter(self, split_id: int, line: RawLine, reason: str) -> None:
        self._sink.dead_letter(split_id, line.offset, line.data, reason)

    def split_finished(self, split_id: int, state: SplitState) -> None:
        self._splits[split_id].reading_done = True

    # -- operator output (mailbox thread) ------------------------------------------------

    def _collect_enriched(self, batch: EventBatch, _timestamp: int | None) -> None:
        assert batch.rows is not None
        self._sink.write_batch(self._days[batch.split_id], batch.rows)

    def _on_marker(self, marker: Marker) -> None:
        raise AssertionError(f"unexpected marker {marker!r}")

    # -- checkpoints (mailbox thread) ----------------------------------------------------

    def _on_checkpoint_event(self, event: str, checkpoint_id: int) -> None:
        """From the listener (event loop = mailbox thread): handled as a priority mail."""
        action = {
            "trigger": self._on_trigger,
            "complete": self._on_complete,
            "abort": self._on_abort,
        }[event]
        self._checkpoint_mails.execute(lambda: action(checkpoint_id), f"checkpoint {event}")

    def _on_trigger(self, checkpoint_id: int) -> None:
        if checkpoint_id <= self._last_trigger:
            return  # repeated (notification and poll both delivered it)
        self._last_trigger = checkpoint_id
        self._flush_events()  # (empty here: flushed before the mailbox runs a mail)
        final = self._input_ended and self._operator.in_flight() == 0
        # Steps 1-2: split states and the operator's inputs not yet emitted.
        states = snapshot_splits(self._splits, self._operator.snapshot(), checkpoint_id)
        # Step 3: the sink's pre-commit; the writer thread closes the staged files, then
        # writes the acknowledgement (asynchronous part, off the mailbox thread).
        staged = self._sink.pre_commit()
        if final:
            self._final_acks.add(checkpoint_id)
        snapshot = {"splits": states, "attempt": self._attempt}
        done = self._io.submit(self._acknowledge, checkpoint_id, final, snapshot, staged)
        done.add_done_callback(
            lambda f: self._checkpoint_mails.execute(
                lambda: self._acknowledged(f, checkpoint_id, final), "checkpoint acknowledged"
            )
        )

    def _acknowledge(
        self,
        checkpoint_id: int,
        final: bool,
        snapshot: dict[str, Any],
        staged: Future[StagedOutput],
    ) -> None:
        """Writer thread."""
        out = staged.result()
        if not self._config.exactly_once and self._config.sink == SINK_NAME:
            publish_files(out.files)  # AT_LEAST_ONCE: visible before the offsets commit
        acknowledge(
            self._engine,
            Acknowledgement(
                run_id=self._config.run_id,
                checkpoint_id=checkpoint_id,
                subtask=self._subtask,
                attempt=self._attempt,
                final=final,
                snapshot=snapshot,
                sink=self._config.sink,
                staged=out.files,
                row_count=out.rows,
                dead_letters=out.dead_letters,
            ),
            two_phase=self._config.exactly_once,
            # AT_LEAST_ONCE: table rows become visible with this subtask's split states.
            sink=None if self._config.exactly_once else committer(self._config.sink),
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
        if checkpoint_id in self._final_acks:
            self._listener.wants_checkpoint = False
            self._processor.all_actions_completed()

    def _on_abort(self, checkpoint_id: int) -> None:
        if checkpoint_id in self._final_acks:
            self._listener.request_checkpoint()  # the next one carries the final snapshot

    def _forget_finished(self, checkpoint_id: int) -> None:
        """Splits whose finished state is committed are no longer this subtask's state."""
        for split_id in [
            split_id
            for split_id, held in self._splits.items()
            if held.finished_in is not None and held.finished_in <= checkpoint_id
        ]:
            del self._splits[split_id]
