"""The task side of partition completeness: the output partition of each record, late records,
and the counts per output partition that a checkpoint acknowledgement carries.

- Output partition: with an event-time field and ``partition_by="day"`` a record's partition
  is the UTC day of its event time (one landing file may feed several partitions); otherwise
  it is the landing day of its split (``splits.partition_key``). A record whose event time
  is null (only possible for a non-required field) falls back to the landing day.
- Late: a record whose event day is a partition already recorded complete, as this task last
  learned it. The set is loaded when the subtask starts and refreshed after each completed
  checkpoint (read off the mailbox thread, handed back as a mail); a record is judged when it
  reaches the sink, so against completions committed before it was read *and* before it was
  written. The race — a completion committed after the judgement, while the record waits for
  its checkpoint — is safe: that completion came from a checkpoint whose barrier this record
  had not passed, so the record was not counted in it; it commits with a later checkpoint,
  and under ``reopen`` its rows reopen the partition, which completes again as the next
  generation. Under ``dead_letter`` such a record is written (judged on time), and the
  partition is reopened the same way: nothing is lost or counted twice. A record re-read
  after a restore is judged again; only one judgement ever commits (the first one's output
  was never committed).
- Rebuild members (``--replace`` of day D, see ``enumerator_service._rebuilds``) are never
  late: rewriting a complete day is their purpose. A member writes only its records of D,
  and only its dead letters of D; its other days' rows and dead letters stay where the first
  processing put them (rows counted as dropped, dead letters not written again, so never
  twice). Its counts of D go to the rebuild's tally, not to ``partition_stats``: they replace
  the day's counts when the rebuild swaps. A *fresh* member (a file of D no run had read)
  writes and counts its other days' records as any first reading does.
- Dead letters count on the record's event day when it is known (a step's dead letter keeps
  the record, event time included), else on the split's landing day (a reader's dead letter:
  the input did not parse, so it has no event time), else — a split without a landing day,
  with event-day partitions — on the day the reader gives it (a Kafka main line's: the
  message's timestamp), else on no day.
- Counts (rows, dead letters, late records per partition), which splits fed which day, the
  rebuilds' tallies and each dead letter's day accumulate on the mailbox thread between two
  barriers and are taken by the checkpoint trigger, so they describe exactly the staged
  output of that interval and commit with it.

Threading: mailbox thread only, except :meth:`EventDays.refresh`'s argument, built elsewhere
and handed over whole.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future
from datetime import UTC, date, datetime
from typing import Protocol

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import sqlalchemy as sa

from enumerator_service import COUNTERS, DETAIL, completed_partitions
from spark_jobs._dead_letters import LATE
from spark_jobs.runtime import MailboxClosedError, MailboxExecutor
from spark_jobs.source._batch import OFFSET, user_rows

__all__ = ["LATE", "EventDays", "PartitionSink", "load_completed", "refresh_in_background"]

_RAW_LIMIT = 4096
_TALLY = ("rows", "dead_letters", "foreign_rows")


class PartitionSink(Protocol):
    """What :meth:`EventDays.write` needs of a sink writer (mailbox-thread methods)."""

    def output_partition(self, day: date | None, rebuild_id: int | None) -> str: ...

    def write_batch(self, partition: str, batch: pa.RecordBatch) -> None: ...

    def dead_letter(self, split_id: int, offset: int, raw: bytes, reason: str) -> None: ...

    def count_dropped(self, records: int) -> None: ...


class EventDays:
    def __init__(
        self,
        event_time: str | None,
        *,
        by_event_day: bool,
        policy: str,
        completed: frozenset[date] = frozenset(),
    ) -> None:
        self._event_time = event_time if by_event_day else None
        self._policy = policy
        self._completed = completed
        self._counts: dict[str, dict[str, int]] = {}
        # The interval's DETAIL: the splits that fed each day, the rebuilds' tallies, the
        # day of each dead letter.
        self._fed: dict[str, set[int]] = {}
        self._tallies: dict[int, dict[str, int]] = {}
        # Records of other days a rebuild member read and left as first written (counted as
        # dropped by the sink, told apart in DETAIL["other_days"]: not removed by a step).
        self._other_days = 0
        self._dead_days: list[tuple[int, int, str]] = []
        # split → (landing day, rebuild id, rebuild day, fresh), kept after the split (its
        # records may still be in the chain).
        self._splits: dict[int, tuple[date | None, int | None, date | None, bool]] = {}

    def split_added(
        self,
        split_id: int,
        landing_day: date | None,
        rebuild_id: int | None,
        rebuild_day: date | None = None,
        *,
        fresh: bool = False,
    ) -> None:
        """``rebuild_day``: the day a rebuild member replaces (default: its landing day).
        ``fresh``: a member no run had read before: its records of other days are written
        and counted as a first reading's (only its rebuild day's go to the rebuild)."""
        if rebuild_id is not None and rebuild_day is None:
            rebuild_day = landing_day
        self._splits[split_id] = (landing_day, rebuild_id, rebuild_day, fresh)

    @property
    def completed(self) -> frozenset[date]:
        return self._completed

    def refresh(self, completed: frozenset[date]) -> None:
        """Completions grow only; a smaller set (a stale read) never un-completes a day."""
        self._completed = self._completed | completed

    def write(self, sink: PartitionSink, rows: pa.RecordBatch, split_id: int) -> None:
        """Records of one split leaving the last step (with the offset column): late ones
        dead-lettered under ``dead_letter``, the others written to their output partitions.

        Lateness is judged here, when a record reaches the sink (so after it was read): its
        output commits with the next checkpoint, after every completion this task knows of.
        A rebuild member writes only the rows of its rebuild's day; its rows of other days
        stay where the first processing wrote them, and are counted as dropped (rows in =
        rows + dropped + dead letters still holds) — unless it is *fresh* (never read before):
        then they are written and counted as usual.
        """
        landing_day, rebuild_id, rebuild_day, fresh = self._splits[split_id]
        only = rebuild_day if rebuild_id is not None and not fresh else None
        days = self._days_of(rows)
        late = self.late_rows(rows, rebuild=rebuild_id is not None, days=days)
        if late is not None and self._event_time is not None:
            for record in rows.filter(late).to_pylist():
                offset = int(record.pop(OFFSET))
                raw = orjson.dumps(record, default=str)[:_RAW_LIMIT]
                sink.dead_letter(split_id, offset, raw, LATE)
                day = record[self._event_time].astimezone(UTC).date()
                self.count_late_dead_letter(day)
                self._fed_by(split_id, day, offset)
            kept = pc.invert(late)
            rows, days = rows.filter(kept), None if days is None else days.filter(kept)
        written = 0
        uncounted = rebuild_day if rebuild_id is not None else None
        groups = self.partitions(rows, landing_day, only=only, uncounted=uncounted, days=days)
        for day, part in groups:
            if part.num_rows:
                rebuilt = rebuild_id is not None and day == rebuild_day
                target = rebuild_id if rebuilt else None
                sink.write_batch(sink.output_partition(day, target), user_rows(part))
                written += part.num_rows
                if day is not None:
                    self._fed_by(split_id, day)
                if rebuild_id is not None and rebuilt:
                    foreign = part.num_rows if landing_day not in (None, day) else 0
                    self._tally(rebuild_id, rows=part.num_rows, foreign_rows=foreign)
        if written < rows.num_rows:
            sink.count_dropped(rows.num_rows - written)
            if rebuild_id is not None:
                self._other_days += rows.num_rows - written

    def late_rows(
        self, rows: pa.RecordBatch, *, rebuild: bool, days: pa.Array | None = None
    ) -> pa.Array | None:
        """A boolean mask of the late records of ``rows`` that the policy dead-letters, or
        None when there are none (always None under ``reopen``, for a rebuild member, and
        without event-day partitions). ``days``: :meth:`_days_of` of ``rows``, if known."""
        if self._policy != "dead_letter" or rebuild or not self._completed:
            return None
        if self._event_time is None or not rows.num_rows:
            return None
        days = self._days_of(rows) if days is None else days
        late = pc.fill_null(pc.is_in(days, pa.array(sorted(self._completed), pa.date32())), False)
        return late if pc.any(late).as_py() else None

    def count_late_dead_letter(self, day: date) -> None:
        self._add(day.isoformat(), dead_letters=1, late_records=1)

    def partitions(
        self,
        rows: pa.RecordBatch,
        landing_day: date | None,
        *,
        only: date | None = None,
        uncounted: date | None = None,
        days: pa.Array | None = None,
    ) -> Iterator[tuple[date | None, pa.RecordBatch]]:
        """``rows`` split by output partition, counted (rows, and late rows written under
        ``reopen``). ``only``: a rebuild member keeps just the rows of its rebuild's day (its
        rows of other days are in those partitions already). ``uncounted``: a rebuild's day,
        whose rows a rebuild tallies apart (they replace rows already counted). ``days``:
        :meth:`_days_of` of ``rows``, if known."""
        days = self._days_of(rows) if days is None else days
        if days is None:
            groups: list[tuple[date | None, pa.RecordBatch]] = [(landing_day, rows)]
        else:
            if landing_day is not None:
                days = pc.fill_null(days, pa.scalar(landing_day, pa.date32()))
            distinct = pc.unique(days).to_pylist()
            if len(distinct) == 1:
                # The usual block (one landing file, one day): no copy of its rows.
                groups = [(distinct[0], rows)]
            else:
                groups = []
                for day in distinct:
                    mask = pc.is_null(days) if day is None else pc.equal(days, day)
                    groups.append((day, rows.filter(pc.fill_null(mask, False))))
        for day, part in sorted(groups, key=lambda g: (g[0] is None, g[0] or date.min)):
            if only is not None and day != only:
                continue
            if day is not None and part.num_rows and only is None and day != uncounted:
                # Written to a complete partition (``reopen``): counted late. A rebuild's rows
                # are not counted: they replace rows already counted (see the module notes).
                late = part.num_rows if day in self._completed else 0
                foreign = part.num_rows if landing_day not in (None, day) else 0
                self._add(
                    day.isoformat(), rows=part.num_rows, late_records=late, foreign_rows=foreign
                )
            yield day, part

    def count_dead_letter(
        self,
        split_id: int,
        offset: int,
        raw: bytes | None = None,
        *,
        read_day: date | None = None,
    ) -> bool:
        """A record of the split rejected: whether to write the dead letter, counted on its
        output partition: the UTC day of its event time when that is known — a step's dead
        letter (``raw``: the record as a JSON object, as the per-record and lookup steps keep
        it) with a valid event time — else the split's landing day (a reader's dead letter:
        the input did not parse), else ``read_day`` (the reader's day of a split without a
        landing day: a Kafka message's timestamp) when the output has event-day partitions.
        A rebuild member keeps only the dead letters of its rebuild's day (into the
        rebuild's tally); the others were written by the first processing and stay (False:
        not written twice) — a fresh member's are its first."""
        landing_day, rebuild_id, rebuild_day, fresh = self._splits[split_id]
        day = self.event_day(raw) if raw is not None else None
        day = day or landing_day or (read_day if self._event_time is not None else None)
        if rebuild_id is not None and day == rebuild_day:
            self._tally(rebuild_id, dead_letters=1)
        elif rebuild_id is not None and not fresh:
            self._other_days += 1
            return False
        elif day is not None:
            self._add(day.isoformat(), dead_letters=1)
        if day is not None:
            self._fed_by(split_id, day, offset)
        return True

    def event_day(self, raw: bytes) -> date | None:
        """The UTC event day of a dead-lettered record kept as JSON; None without event-day
        partitions, or when ``raw`` holds no valid zoned event time (truncated at 4 KiB, not
        an object, the field null or overwritten by a step's bad value)."""
        if self._event_time is None:
            return None
        try:
            value = orjson.loads(raw).get(self._event_time)
            moment = datetime.fromisoformat(value) if isinstance(value, str) else None
        except (orjson.JSONDecodeError, AttributeError, ValueError):
            return None
        if moment is None or moment.tzinfo is None:
            return None
        return moment.astimezone(UTC).date()

    def touch(self, split_id: int) -> None:
        """The split finished: without event-day partitions its landing day's partition
        exists even if nothing was written (an empty file, everything filtered)."""
        day, rebuild_id, _, _ = self._splits[split_id]
        if day is not None and rebuild_id is None and self._event_time is None:
            self._add(day.isoformat())

    def _days_of(self, rows: pa.RecordBatch) -> pa.Array | None:
        """The UTC event day of each row; None without event-day partitions (or rows)."""
        if self._event_time is None or not rows.num_rows:
            return None
        return _days(rows.column(self._event_time))

    # -- checkpoint -----------------------------------------------------------------------

    def take_counts(self) -> dict[str, dict[str, int]]:
        """The counts since the last barrier (and start counting anew)."""
        counts, self._counts = self._counts, {}
        return counts

    def take_detail(self) -> dict[str, object]:
        """The interval's :data:`DETAIL` (empty: nothing to record), and start anew."""
        detail: dict[str, object] = {}
        if self._fed:
            detail["splits"] = {day: sorted(ids) for day, ids in sorted(self._fed.items())}
        if self._tallies:
            detail["rebuilds"] = {str(r): tally for r, tally in sorted(self._tallies.items())}
        if self._dead_days:
            detail["dead_letters"] = [list(letter) for letter in self._dead_days]
        if self._other_days:
            detail["other_days"] = self._other_days
        self._fed, self._tallies, self._dead_days, self._other_days = {}, {}, [], 0
        return detail

    def take(self) -> dict[str, dict[str, object]]:
        """:meth:`take_counts` with :meth:`take_detail` under :data:`DETAIL` (when any): what
        an acknowledgement carries as ``partitions``."""
        counts: dict[str, dict[str, object]] = {
            day: dict(values) for day, values in self.take_counts().items()
        }
        detail = self.take_detail()
        if detail:
            counts[DETAIL] = detail
        return counts

    def _fed_by(self, split_id: int, day: date, dead_letter: int | None = None) -> None:
        self._fed.setdefault(day.isoformat(), set()).add(split_id)
        if dead_letter is not None:
            self._dead_days.append((split_id, dead_letter, day.isoformat()))

    def _tally(self, rebuild_id: int, **values: int) -> None:
        total = self._tallies.setdefault(rebuild_id, dict.fromkeys(_TALLY, 0))
        for name, value in values.items():
            total[name] += value

    def _add(self, day: str, **values: int) -> None:
        total = self._counts.setdefault(day, dict.fromkeys(COUNTERS, 0))
        for name, value in values.items():
            total[name] += value


def load_completed(engine: sa.Engine, source: str) -> frozenset[date]:
    """The source's completed partitions. Blocking: never on the mailbox thread."""
    with engine.connect() as conn:
        return completed_partitions(conn, source)


def refresh_in_background(
    days: EventDays,
    io: Executor,
    mails: MailboxExecutor,
    load: Callable[[], frozenset[date]],
) -> None:
    """After a completed checkpoint (mailbox thread): ``load`` runs on ``io`` (blocking), the
    result reaches ``days`` as a mail on the mailbox thread."""

    def hand_back(future: Future[frozenset[date]]) -> None:
        with contextlib.suppress(MailboxClosedError):  # the subtask ended meanwhile
            mails.execute(lambda: days.refresh(future.result()), "completed partitions")

    io.submit(load).add_done_callback(hand_back)


def _days(times: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The UTC day of each timestamp (null stays null)."""
    if isinstance(times, pa.ChunkedArray):
        times = times.combine_chunks()
    # A zoned timestamp stores UTC instants: dropping the zone keeps the UTC wall time.
    return pc.cast(times.cast(pa.timestamp(times.type.unit)), pa.date32())
