"""One reader subtask: source reader → async lookup operator → Parquet sink, on one mailbox.

Runs inside a Spark task (a Python worker). The thread calling :func:`run_reader_subtask`
becomes the mailbox thread: it runs the asyncio loop on which the mailbox, the asyncpg lookups
and all operator state live. The split fetcher and the committer are the only other threads;
they talk to the mailbox thread through the hand-off queue and mails.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

from enumerator_service import SplitAssignment, SplitState, SplitStore, connect_engine
from spark_jobs.async_io import (
    NO_RETRY,
    AsyncWaitOperator,
    Marker,
    Output,
    OutputMode,
    exponential_backoff,
)
from spark_jobs.lookup import LookupCache, PostgresLookup
from spark_jobs.runtime import MailboxController, MailboxProcessor, Suspension, run_task
from spark_jobs.sink import CommitResult, SplitCommitter, SplitOutput
from spark_jobs.source import (
    Event,
    FormatRouter,
    HandoffQueue,
    InputStatus,
    RawLine,
    RecordEmitter,
    SourceReaderBase,
    SplitFetcher,
)

__all__ = ["ReaderTask", "TaskConfig", "run_reader_subtask"]

#: Elements the default action moves per call before letting I/O callbacks run.
_SLICE = 512
_USER_COLUMNS = ("name", "country", "tier", "signup_time")


@dataclass(frozen=True, slots=True)
class TaskConfig:
    """Everything a subtask needs; plain values so Spark can ship it to workers."""

    database_url: str
    asyncpg_dsn: str
    run_id: str
    lease_seconds: float
    output_root: str
    staging_root: str
    lookup_schema: str
    lookup_table: str
    lookup_key: str
    capacity: int
    batch_size: int
    pool_size: int
    max_line_bytes: int
    timeout_seconds: float = 30.0
    retries: int = 3
    max_linger_ms: float = 0.0
    cache_rows: int = 0
    cache_ttl_seconds: float = 300.0
    debug: bool = False


@dataclass(frozen=True, slots=True)
class _SplitFinished:
    split_id: int


def _is_transient(error: BaseException) -> bool:
    """Connection-level failures worth retrying; SQL errors (a missing table …) are not."""
    return isinstance(error, OSError | _TRANSIENT)


_TRANSIENT = (
    asyncpg.exceptions.ConnectionDoesNotExistError,
    asyncpg.exceptions.CannotConnectNowError,
    asyncpg.exceptions.TooManyConnectionsError,
    asyncpg.exceptions.InterfaceError,
)


def _resume_on(suspension: Suspension) -> Callable[[Future[None]], None]:
    """Future callback resuming the default action (from whichever thread completes it)."""
    return lambda _future: suspension.resume()


def _join(event: Event, row: Any) -> tuple[Any, ...]:
    user = (None, None, None, None) if row is None else (row[1], row[2], row[3], row[4])
    return (event.split_id, *event[1:], *user)


class ReaderTask:
    def __init__(self, config: TaskConfig, subtask: int) -> None:
        self._config = config
        self._subtask = subtask
        self._outputs: dict[int, SplitOutput] = {}
        self._pending_commits = 0
        self._input_ended = False
        self.results: list[CommitResult] = []

    async def run(self) -> dict[str, Any]:
        config = self._config
        engine = connect_engine(config.database_url, pool_size=2)
        store = SplitStore(engine)
        self._processor = processor = MailboxProcessor(self._default_action, debug=config.debug)
        lookup: PostgresLookup[Event, tuple[Any, ...]] = PostgresLookup(
            config.asyncpg_dsn,
            schema=config.lookup_schema,
            table=config.lookup_table,
            key_column=config.lookup_key,
            columns=_USER_COLUMNS,
            key_of=lambda event: event.user_id,
            joiner=_join,
            max_batch_size=config.batch_size,
            pool_size=config.pool_size,
            max_linger=config.max_linger_ms / 1000,
            # Below the operator's timeout, so a retry re-queries instead of re-attaching to
            # a hung query.
            query_timeout=config.timeout_seconds / (config.retries + 2),
            cache=LookupCache(config.cache_rows, expire_after_write=config.cache_ttl_seconds)
            if config.cache_rows
            else None,
        )
        # Transient database errors (a dropped connection, a restart) are retried.
        retry = (
            exponential_backoff(config.retries, 0.1, 5.0, on_exception=_is_transient)
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
        self._committer = SplitCommitter(
            engine,
            run_id=config.run_id,
            subtask=self._subtask,
            output_root=Path(config.output_root),
            staging_root=Path(config.staging_root),
        )
        self._commit_pool = ThreadPoolExecutor(1, thread_name_prefix=f"committer-{self._subtask}")
        handoff = HandoffQueue(capacity=4)
        # A retried attempt first restores the splits its predecessor held (new epoch).
        restored = store.reclaim(config.run_id, self._subtask, config.lease_seconds)
        router = FormatRouter(max_line_bytes=config.max_line_bytes, dsn=config.asyncpg_dsn)
        fetcher = SplitFetcher(
            router,
            handoff,
            lambda: store.pull_next(config.run_id, self._subtask, config.lease_seconds),
            restored,
            name=f"split-fetcher-{self._subtask}",
        )
        self._reader = SourceReaderBase(fetcher, handoff, RecordEmitter(router))
        await self._operator.open()
        self._reader.start()
        try:
            await processor.run_loop()
        finally:
            self._reader.close()
            self._commit_pool.shutdown(wait=True)
            await self._operator.close()
            engine.dispose()
        metrics = lookup.metrics()
        return {
            "subtask": self._subtask,
            "splits": sum(1 for r in self.results if not r.fenced),
            "fenced": sum(1 for r in self.results if r.fenced),
            "rows_out": sum(r.rows for r in self.results),
            "dead_letters": sum(r.dead_letters for r in self.results),
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
                operator.notify_when_available(controller.suspend_default_action().resume)
                return
            status = reader.poll_next(self)
            if status is InputStatus.MORE_AVAILABLE:
                continue
            suspension = controller.suspend_default_action()
            if status is InputStatus.NOTHING_AVAILABLE:
                reader.is_available().add_done_callback(_resume_on(suspension))
                return
            self._input_ended = True  # END_OF_INPUT: stay suspended, finish when drained
            self._maybe_finish()
            return

    # -- ReaderOutput (mailbox thread) ---------------------------------------------------

    def split_added(self, assignment: SplitAssignment, state: SplitState) -> None:
        self._outputs[assignment.split_id] = SplitOutput(assignment, state)

    def collect(self, event: Event, timestamp: int) -> None:
        self._operator.process_element(event, timestamp)

    def dead_letter(self, split_id: int, line: RawLine, reason: str) -> None:
        self._outputs[split_id].dead.append((line.offset, line.data, reason))

    def split_finished(self, split_id: int, state: SplitState) -> None:
        # In-band: leaves the operator only after every record of the split.
        self._operator.process_marker(Marker(payload=_SplitFinished(split_id)))

    # -- operator output (mailbox thread) ------------------------------------------------

    def _collect_enriched(self, row: tuple[Any, ...], _timestamp: int | None) -> None:
        self._outputs[row[0]].rows.append(row[1:])

    def _on_marker(self, marker: Marker) -> None:
        finished = marker.payload
        assert isinstance(finished, _SplitFinished)
        out = self._outputs.pop(finished.split_id)
        self._pending_commits += 1
        future = self._commit_pool.submit(self._committer.commit, out)
        executor = self._processor.executor()
        future.add_done_callback(
            lambda f: executor.execute(lambda: self._on_committed(f), "split committed")
        )

    def _on_committed(self, future: Future[CommitResult]) -> None:
        self._pending_commits -= 1
        self.results.append(future.result())  # a failed commit fails the task (Spark retries)
        self._maybe_finish()

    def _maybe_finish(self) -> None:
        if self._input_ended and self._operator.in_flight() == 0 and self._pending_commits == 0:
            self._processor.all_actions_completed()


def run_reader_subtask(config: TaskConfig, subtask: int) -> dict[str, Any]:
    """Entry point inside a Spark task: run subtask ``subtask`` of the run to completion."""
    return run_task(ReaderTask(config, subtask).run)
