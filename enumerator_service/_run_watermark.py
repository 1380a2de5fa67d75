"""The run watermark of a completed checkpoint, from its subtasks' snapshots.

Flink's ``StatusWatermarkValve`` over the reader subtasks (channels), with closed channels:

- A subtask whose input ended and drained (``snapshot["finished"]`` with nothing pending in its
  chain, or a final acknowledgement) is a *closed* channel: +infinity. So is a subtask that did
  not acknowledge (it closed at an earlier checkpoint). But a subtask that read a piece of a
  stream that goes on (``snapshot["stream"]``: a bounded run's Kafka partition or slot
  offsets, up to where the run started; a CDC snapshot chunk) is *stopped*, not ended: it
  closes at the greatest watermark its splits reached — a Kafka day split (a day's whole
  time range, ``snapshot["day_end"]``) at least at its day's end — and when every subtask
  closed, the run watermark is the least a stopped one reached (+infinity only when none
  is stopped): a backfill of day D completes D, not the day the main line stopped in.
  Spark's ``availableNow``: a scheduled run's end is not the end of the topic, and the day
  it stopped in stays open for the next run's records (it was completed, and their records
  came late: a trial's every record of the current day after the first run).
- A subtask is *idle* while its snapshot says so (``snapshot["idle"]``: no split, or every
  split idle, and nothing in its operator chain). An idle subtask never holds the run back: the
  run watermark is the minimum over the *active* subtasks' sink-side watermarks, a subtask
  without one yet counting as -infinity (it holds the others back until its first marker
  reaches its sink).
- When no open subtask is active, the run watermark is the greatest watermark any subtask's
  sink reached (Flink: all channels idle → the maximum across them). Without that, a
  continuous run over sparse input — each subtask reads a small file between two barriers and
  is idle at every barrier — never advanced, and no day completed while the run lived.
  Sound: every record those subtasks read is at their sinks and commits with this checkpoint.
  It applies only when the run holds no split still to be read (ASSIGNED to it in the pool, or
  READING — a concurrently read stream's READING split aside: it is in its subtask's reader,
  whose idle status covers it): such a split's event time is unknown, and an idle subtask is
  about to take it, so the run waits for the next checkpoint rather than pass it. A
  concurrently read stream split (``CONCURRENT_STREAM_KINDS``: Kafka; no landing day holds
  days back for it) ASSIGNED to the run and not yet pulled by its owner stops the run
  watermark whatever the subtasks say: its owner may not have started reading yet. A CDC
  stream split is not read concurrently (it may wait in its fetcher behind the snapshot
  chunks pulled with it): it keeps the file rules.

The run watermark never moves backwards (``record_run_watermark`` keeps the greatest), and a
day completes only when it has passed the day's end *and* every registered split of the day
(and earlier) is read and committed (``complete_partitions``): splits registered but not yet
read hold their days back whatever the watermark says.

Threading: pure functions, and one blocking query (``run_watermark_of``) in the completion
transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from enumerator_service._completeness import END_OF_INPUT, NO_WATERMARK
from enumerator_service._schema import SplitStatus, splits
from enumerator_service._splits import CONCURRENT_STREAM_KINDS

__all__ = ["SubtaskMark", "all_idle", "run_watermark", "run_watermark_of", "subtask_mark"]


@dataclass(frozen=True, slots=True)
class SubtaskMark:
    """One subtask's part of a checkpoint's run watermark."""

    #: The last watermark that reached its sink (NO_WATERMARK: none yet).
    reached: datetime = NO_WATERMARK
    #: Its input ended and drained: a closed channel (+infinity).
    closed: bool = False
    #: No active split and nothing in its chain: not part of the minimum.
    idle: bool = False
    #: Closed after a piece of a stream that goes on: at ``reached``, not +infinity.
    stopped: bool = False

    @property
    def watermark(self) -> datetime:
        """What it contributes to the minimum while active."""
        return END_OF_INPUT if self.closed and not self.stopped else self.reached

    @property
    def holds(self) -> bool:
        """Part of the minimum: active, and not a stopped subtask without a watermark (a
        piece without records says nothing of the event times to come)."""
        return not self.idle and not (self.stopped and self.reached <= NO_WATERMARK)


def subtask_mark(snapshot: Mapping[str, Any], *, final: bool = False) -> SubtaskMark:
    """A subtask's mark from its checkpoint snapshot (see ``Acknowledgement.snapshot``).

    ``finished`` closes the channel only once nothing of its input is still in its operator
    chain (no split state with ``pending`` ranges): records in flight at the barrier commit
    with a later checkpoint, and must not find their day already complete. An idle subtask
    with nothing pending has reached the greatest watermark of its splits (see the code).
    """
    reached = _parse(snapshot.get("watermark"))
    states = snapshot.get("splits", ())
    drained = not any(state.get("pending") for state in states)
    closed = final or (bool(snapshot.get("finished")) and drained)
    stopped = closed and bool(snapshot.get("stream"))
    idle = bool(snapshot.get("idle")) and not closed
    if stopped and snapshot.get("day_end") is not None:
        reached = max(reached, _parse(snapshot["day_end"]))
    if (idle or stopped) and drained:
        # Every split idle and nothing in the chain: every record its splits emitted is at
        # the sink, so it has reached its splits' greatest watermark, as an all-idle run
        # reaches its subtasks' greatest. Its markers stopped at the minimum over the splits
        # still active: a split going idle after the others (the last records of a quiet
        # topic) never raised them, and a run whose subtasks all went idle so stayed below a
        # day every split had passed — the day never completed while the run lived.
        marks = [_parse(state.get("watermark")) for state in states]
        reached = max([reached, *marks])
    return SubtaskMark(reached, closed=closed, idle=idle, stopped=stopped)


def _parse(value: object) -> datetime:
    if value is None:
        return NO_WATERMARK
    parsed = datetime.fromisoformat(str(value))
    if parsed.tzinfo is None:
        raise ValueError(f"snapshot watermark {value!r} has no time zone (must be UTC)")
    return parsed.astimezone(UTC)


def all_idle(marks: Sequence[SubtaskMark]) -> bool:
    """Some subtask is open and every open one is idle: the case that needs the pool."""
    open_marks = [m for m in marks if not m.closed]
    return bool(open_marks) and all(m.idle for m in open_marks)


def run_watermark(marks: Iterable[SubtaskMark], *, unread: bool = False) -> datetime:
    """The run watermark of one checkpoint (module rules). ``unread``: the run holds splits
    still to be read. No subtask, or only closed ones: END_OF_INPUT, or the least watermark
    a stopped one reached; NO_WATERMARK means no new information (the stored run watermark
    stays where it is)."""
    marks = list(marks)
    if all(m.closed for m in marks):
        stopped = [m.reached for m in marks if m.stopped]
        if not stopped:
            return END_OF_INPUT
        return min((w for w in stopped if w > NO_WATERMARK), default=NO_WATERMARK)
    active = [m.watermark for m in marks if m.holds]
    if any(not m.closed for m in marks if m.holds):
        return min(active)
    if unread:
        return NO_WATERMARK
    return max(m.reached for m in marks)


def run_watermark_of(
    conn: Connection, run_id: str, snapshots: Iterable[tuple[Mapping[str, Any], bool]]
) -> datetime:
    """Inside checkpoint completion, after the snapshots' split states were applied: the run
    watermark from the acknowledgements' ``(snapshot, final)``."""
    snapshots = list(snapshots)
    marks = [subtask_mark(snapshot, final=final) for snapshot, final in snapshots]
    # The splits the subtasks' readers held at their barriers (their idle status covers
    # these, and only these).
    announced = {int(s["id"]) for snapshot, _ in snapshots for s in snapshot.get("splits", ())}
    if not all(m.closed for m in marks) and _holds_unpulled_stream(conn, run_id, announced):
        # A stream split handed to the run that its owner has not pulled yet (a subtask
        # starting, a partition just found), or pulled but not yet in its subtask's reader
        # at the barrier: its event times are unknown and no landing day holds the days
        # back for it (its partition key is NULL) — no new information.
        return NO_WATERMARK
    unread = all_idle(marks) and _holds_unread(conn, run_id)
    return run_watermark(marks, unread=unread)


def _holds_unpulled_stream(conn: Connection, run_id: str, announced: set[int]) -> bool:
    # READING and absent from every snapshot: pulled after its subtask's barrier, or between
    # the pull and the mailbox hearing of it (the fetcher announces it with its next item).
    unannounced = sa.and_(
        splits.c.status == SplitStatus.READING, splits.c.id.not_in(sorted(announced))
    )
    found = conn.execute(
        sa.select(sa.literal(1))
        .where(
            splits.c.run_id == run_id,
            splits.c.kind.in_(sorted(CONCURRENT_STREAM_KINDS)),
            sa.or_(splits.c.status == SplitStatus.ASSIGNED, unannounced),
        )
        .limit(1)
    ).first()
    return found is not None


def _holds_unread(conn: Connection, run_id: str) -> bool:
    # A stream's READING split is in its subtask's reader (a concurrent reader takes every
    # split as it is pulled), so that subtask's idle status covers it; an open split is
    # READING for ever, and counting it would stop days completing once every partition
    # is quiet. A split pulled in a batch of file splits may still wait in the fetcher.
    waiting = sa.or_(
        splits.c.status == SplitStatus.ASSIGNED,
        sa.and_(
            splits.c.status == SplitStatus.READING,
            splits.c.kind.not_in(sorted(CONCURRENT_STREAM_KINDS)),
        ),
    )
    found = conn.execute(
        sa.select(sa.literal(1)).where(splits.c.run_id == run_id, waiting).limit(1)
    ).first()
    return found is not None
