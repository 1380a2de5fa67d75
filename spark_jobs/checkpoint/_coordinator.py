"""CheckpointCoordinator: the driver side of Sluice's barrier checkpoints.

Triggers checkpoint *n* (every ``interval`` seconds, and at once when a subtask whose input
ended asks for its final checkpoint), collects the subtasks' acknowledgements from Postgres
through a barrier handler — the subtasks are its channels, a subtask whose final checkpoint
completed is a closed channel — and completes or aborts *n*. One checkpoint at a time.

Threading: the coordinator is its own thread and the only user of its handler and store.
Acknowledgements and requests wake it through ``LISTEN``; a short poll is the safety net
for notifications lost while the database restarts.

A completion whose outcome the coordinator missed (Postgres crashed under the publish after
the commit, or under the commit's acknowledgement) must not leave its final subtasks open:
they ended, so every later checkpoint would wait for them, time out, and the run would never
end. ``PublishFailed`` hands the completion over; after a reconnect and a timed-out
checkpoint the open subtasks are checked against Postgres (``CheckpointStore.finished``).
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psycopg
import sqlalchemy as sa

from enumerator_service import (
    COORDINATOR_CHANNEL,
    AbortCause,
    CheckpointStore,
    CompletedCheckpoint,
    FencedError,
    PublishFailed,
    TransactionalSink,
)
from spark_jobs.checkpoint._aligned import AlignedBarrierHandler
from spark_jobs.checkpoint._common import AbortReason
from spark_jobs.checkpoint._tracker import BarrierTracker

if TYPE_CHECKING:
    from spark_jobs.connectors import CompletionHook

__all__ = ["AbortedCheckpoint", "CheckpointCoordinator", "CoordinatorStats"]

_log = logging.getLogger(__name__)
_POLL = 0.25  # seconds between acknowledgement polls when no notification arrives
_DB_ERRORS = (sa.exc.OperationalError, sa.exc.InterfaceError, psycopg.OperationalError)


@dataclass(frozen=True, slots=True)
class AbortedCheckpoint:
    checkpoint_id: int
    cause: AbortCause
    detail: str


@dataclass
class CoordinatorStats:
    completed: list[CompletedCheckpoint] = field(default_factory=list)
    aborted: list[AbortedCheckpoint] = field(default_factory=list)

    def aborted_by(self, cause: AbortCause) -> int:
        return sum(1 for aborted in self.aborted if aborted.cause is cause)


@dataclass
class _Pending:
    checkpoint_id: int
    deadline: float
    fed: set[int] = field(default_factory=set)


class CheckpointCoordinator(threading.Thread):
    """Runs checkpoints for one run of ``subtasks`` reader subtasks until stopped, or until
    every subtask's final checkpoint completed.

    ``on_failure`` is called (from this thread) when the coordinator gives up — the database
    stayed unreachable for ``give_up_after`` seconds — so the driver can cancel the job
    instead of leaving subtasks waiting for a final checkpoint that never comes.
    ``on_stop_request`` is called (from this thread, once) with the line of the first
    deterministic error a subtask reports: the driver cancels the job instead of letting
    Spark retry the stage. ``on_complete`` (the source connector's hook: a Kafka source
    commits offsets to its consumer group) is told of each completed checkpoint, from this
    thread, after its Postgres transaction; what it raises is logged, never fails the run.
    """

    def __init__(
        self,
        engine: sa.Engine,
        run_id: str,
        subtasks: int,
        sinks: Mapping[str, TransactionalSink],
        *,
        interval: float,
        timeout: float,
        exactly_once: bool = True,
        source: str | None = None,
        on_failure: Callable[[BaseException], None] | None = None,
        on_stop_request: Callable[[str], None] | None = None,
        on_complete: CompletionHook | None = None,
        give_up_after: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
        history_seconds: float | None = None,
    ) -> None:
        super().__init__(name=f"checkpoint-coordinator-{run_id}", daemon=True)
        self._engine = engine
        self._run_id = run_id
        self._store = CheckpointStore(
            engine, run_id, sinks, source=source, history_seconds=history_seconds
        )
        self._interval = interval
        self._timeout = timeout
        self._two_phase = exactly_once
        self._on_failure = on_failure
        self._on_stop_request = on_stop_request
        self._on_complete = on_complete
        self._give_up_after = give_up_after
        self._clock = clock
        self._stop_event = threading.Event()
        self._handler: AlignedBarrierHandler[None] | BarrierTracker[None]
        if exactly_once:
            self._handler = AlignedBarrierHandler(subtasks, self._aligned, self._aborted)
        else:
            self._handler = BarrierTracker(subtasks, self._aligned, self._aborted)
        self._open = set(range(subtasks))
        self._next_id = 1
        self._pending: _Pending | None = None
        self._ready: int | None = None
        self._requested = False
        self.stats = CoordinatorStats()
        self.error: BaseException | None = None
        #: The first deterministic error a subtask reported (``"failed"`` event): the run
        #: must stop (``on_stop_request`` was called with it).
        self.stop_requested: str | None = None

    # -- barrier handler callbacks (this thread) ----------------------------------------

    def _aligned(self, checkpoint_id: int) -> None:
        self._ready = checkpoint_id

    def _aborted(self, checkpoint_id: int, reason: AbortReason) -> None:
        _log.debug("checkpoint %d aborted by the barrier handler: %s", checkpoint_id, reason)

    # -- thread -----------------------------------------------------------------------------

    def request_checkpoint(self) -> None:
        """Trigger a checkpoint as soon as none is pending (any thread)."""
        self._requested = True

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=30)

    def run(self) -> None:
        failing_since: float | None = None
        listener: psycopg.Connection[Any] | None = None
        first_listen = True
        next_trigger = self._clock() + self._interval if self._interval > 0 else math.inf
        while not self._stop_event.is_set():
            try:
                if listener is None:
                    listener = self._listen()
                    # Requests sent while we were reconnecting are lost: assume there was one.
                    self._requested = self._requested or not first_listen
                    if not first_listen:
                        # A completion may have committed without our hearing of it.
                        self._close_finished()
                    first_listen = False
                self._wait(listener, next_trigger)
                if self._pending is None and self._open:
                    now = self._clock()
                    if self._requested or now >= next_trigger:
                        self._requested = False
                        self._trigger()
                        if self._interval > 0:
                            next_trigger = now + self._interval
                if self._pending is not None:
                    self._collect(self._pending)
                failing_since = None
                if not self._open and self._pending is None:
                    # Every subtask's final checkpoint completed: no checkpoint can follow
                    # (a restarted attempt of a finished subtask ends at once), so the thread
                    # ends now instead of sleeping out a poll before stop() sees it.
                    break
            except _DB_ERRORS as exc:
                # Postgres restarting: keep the pending checkpoint, reconnect, resume.
                _log.warning("checkpoint coordinator: database unavailable (%s)", exc)
                if listener is not None:
                    listener.close()
                    listener = None
                now = self._clock()
                failing_since = failing_since or now
                if now - failing_since > self._give_up_after:
                    self._fail(exc)
                    return
                self._stop_event.wait(0.5)
            except BaseException as exc:
                self._fail(exc)
                return
        self._store.prune_ended()  # the old bookkeeping the last (batched) prune left
        if listener is not None:
            listener.close()

    def _fail(self, exc: BaseException) -> None:
        _log.error("checkpoint coordinator failed", exc_info=exc)
        self.error = exc
        if self._on_failure is not None:
            self._on_failure(exc)

    def _listen(self) -> psycopg.Connection[Any]:
        raw = self._engine.raw_connection()
        conn: psycopg.Connection[Any] = raw.driver_connection  # type: ignore[assignment]
        raw.detach()  # a LISTEN connection must never go back to the pool
        conn.rollback()
        conn.autocommit = True
        conn.execute(f"LISTEN {COORDINATOR_CHANNEL}")
        return conn

    def _wait(self, listener: psycopg.Connection[Any], next_trigger: float) -> None:
        """Sleep until the next deadline, the poll interval, or a notification of this run.

        ``notifies(stop_after=1)`` returns at the first notification (a larger ``stop_after``
        would wait out the whole timeout); the loop calls us again at once, so a burst of
        acknowledgements costs one short wait each.
        """
        deadline = min(
            next_trigger,
            self._pending.deadline if self._pending else math.inf,
            self._clock() + _POLL,
        )
        while True:
            wait = deadline - self._clock()
            # Several notifications arriving in one packet are all yielded: each is handled
            # (a "failed" behind an acknowledgement must not be lost).
            notified = list(listener.notifies(timeout=max(0.0, wait), stop_after=1))
            if not notified:
                return
            ours = False
            for notification in notified:
                ours = self._handle(notification.payload) or ours
            if ours or self._clock() >= deadline:
                return
            # only another run's traffic: keep waiting until the deadline

    def _handle(self, payload: str) -> bool:
        """Handle one notification; True if it was this run's."""
        try:
            message = json.loads(payload)
        except ValueError:
            return False
        if not isinstance(message, dict) or message.get("run") != self._run_id:
            return False
        if message.get("event") == "request":
            self._requested = True
        elif message.get("event") == "failed":
            self._stop_request(str(message.get("error", "a subtask failed")))
        return True

    def _stop_request(self, line: str) -> None:
        """A subtask hit a deterministic error (see ``spark_jobs.jobs._fatal``)."""
        if self.stop_requested is not None:
            return
        _log.info("run %s stops: %s", self._run_id, line)
        self.stop_requested = line
        if self._on_stop_request is not None:
            self._on_stop_request(line)

    # -- checkpoints ----------------------------------------------------------------------

    def _trigger(self) -> None:
        checkpoint_id = self._next_id
        self._next_id += 1
        self._store.trigger(checkpoint_id)
        self._pending = _Pending(checkpoint_id, self._clock() + self._timeout)

    def _collect(self, pending: _Pending) -> None:
        n = pending.checkpoint_id
        for subtask, _final in self._store.acks(n):
            if subtask in pending.fed or subtask not in self._open:
                continue
            pending.fed.add(subtask)
            self._handler.process_barrier(subtask, n)
            while isinstance(self._handler, AlignedBarrierHandler) and self._handler.has_pending:
                self._handler.release()
        if self._ready == n:
            self._ready = None
            self._pending = None
            failed: PublishFailed | None = None
            try:
                done = self._store.complete(n, two_phase=self._two_phase)
            except FencedError as exc:
                # An acknowledgement came from an attempt that has been superseded.
                self._abort(n, AbortCause.FENCED, str(exc))
                return
            except PublishFailed as exc:
                failed, done = exc, exc.completed
            if done is not None:
                self._completed(done)
            if failed is not None:
                # Committed and counted (its final subtasks ended); now the failure — a
                # database error is retried (the next completion or the run's recovery
                # publishes the output), anything else fails the run. Raised outside the
                # handler: its chain stays its own (inside, it would gain the PublishFailed
                # whose cause it is — a cycle).
                raise failed.cause
        elif self._clock() >= pending.deadline:
            self._pending = None
            acked = f"{len(pending.fed)} of {len(self._open)} subtasks acked"
            self._abort(n, AbortCause.TIMEOUT, acked)
            channel = min(self._open)
            self._handler.process_cancellation(channel, n)
            # A subtask that never acknowledges may have ended with a completion we missed.
            self._close_finished()

    def _completed(self, done: CompletedCheckpoint) -> None:
        self.stats.completed.append(done)
        for completion in done.completions:
            _log.info(
                "checkpoint %d completed partition %s of %s (generation %d, %d rows)",
                done.checkpoint_id,
                completion.partition_key,
                completion.source,
                completion.generation,
                completion.rows,
            )
        for subtask in done.final_subtasks:
            self._close(subtask)
        if self._on_complete is not None:
            try:
                self._on_complete.completed(done.checkpoint_id)
            except Exception:  # only for lag tools: the checkpoint stands
                _log.warning(
                    "checkpoint %d: completion hook failed", done.checkpoint_id, exc_info=True
                )

    def _close(self, subtask: int) -> None:
        if subtask in self._open:
            # The subtask finished: a closed channel for every later checkpoint.
            self._open.discard(subtask)
            self._handler.process_end_of_partition(subtask)

    def _close_finished(self) -> None:
        """Close every open subtask whose final snapshot a completed checkpoint carries."""
        for subtask in sorted(self._open):
            if self._store.finished(subtask):
                _log.info("subtask %d finished with a completion the coordinator missed", subtask)
                self._close(subtask)

    def _abort(self, checkpoint_id: int, cause: AbortCause, detail: str) -> None:
        _log.info("checkpoint %d aborted: %s: %s", checkpoint_id, cause.value, detail)
        self._store.abort(checkpoint_id, cause, detail)
        self.stats.aborted.append(AbortedCheckpoint(checkpoint_id, cause, detail))
        self._requested = True  # subtasks waiting for a final checkpoint need another
