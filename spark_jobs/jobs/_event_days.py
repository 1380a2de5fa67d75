"""The task side of partition completeness: the output partition of each record, late records,
and the counts per output partition that a checkpoint acknowledgement carries.

- Output partition: with an event-time field and ``partition_by="day"`` a record's partition
  is the UTC day of its event time (one landing file may feed several partitions); otherwise
  it is the landing day of its split (``splits.partition_key``). A record whose event time
  is null (only possible for a non-required field) falls back to the landing day.
- Late: a record whose event day is a partition already recorded complete, as this task last
  learned it. The set is loaded when the subtask starts and refreshed after each completed
  checkpoint (off the mailbox thread, handed back as a mail), so a record is judged against
  completions committed *before* it was read. The race — a completion committed while the
  record is in flight — is safe: that completion came from a checkpoint whose barrier this
  record had not passed, so the record was not counted in it; it is written to (or
  dead-lettered from) the now-complete partition by a later checkpoint, and under
  ``reopen`` its rows reopen the partition, which completes again as the next generation.
  Under ``dead_letter`` such a record is written, not dead-lettered: judged on time when read.
- Rebuild members (``--replace``) are never late: rewriting a complete day is their purpose.
- Counts (rows, dead letters, late records per partition) accumulate on the mailbox thread
  between two barriers and are taken by the checkpoint trigger, so they describe exactly the
  staged output of that interval and commit with it.

Threading: mailbox thread only, except :meth:`EventDays.refresh`'s argument, built elsewhere
and handed over whole.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import date

import pyarrow as pa
import pyarrow.compute as pc

from enumerator_service._completeness import COUNTERS

__all__ = ["LATE", "EventDays"]

#: The dead-letter reason of a late record under ``late_records="dead_letter"``.
LATE = "late"


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

    @property
    def completed(self) -> frozenset[date]:
        return self._completed

    def refresh(self, completed: frozenset[date]) -> None:
        """Completions grow only; a smaller set (a stale read) never un-completes a day."""
        self._completed = self._completed | completed

    # -- source side --------------------------------------------------------------------

    def late_rows(self, rows: pa.RecordBatch, *, rebuild: bool) -> pa.Array | None:
        """A boolean mask of the late records of ``rows`` that the policy dead-letters, or
        None when there are none (always None under ``reopen``, for a rebuild member, and
        without event-day partitions)."""
        if self._policy != "dead_letter" or rebuild or not self._completed:
            return None
        if self._event_time is None or not rows.num_rows:
            return None
        days = _days(rows.column(self._event_time))
        late = pc.fill_null(pc.is_in(days, pa.array(sorted(self._completed), pa.date32())), False)
        return late if pc.any(late).as_py() else None

    def count_late_dead_letter(self, day: date) -> None:
        self._add(day.isoformat(), dead_letters=1, late_records=1)

    # -- sink side ------------------------------------------------------------------------

    def partitions(
        self, rows: pa.RecordBatch, landing_day: date | None, *, only: date | None = None
    ) -> Iterator[tuple[date | None, pa.RecordBatch]]:
        """``rows`` split by output partition, counted (rows, and late rows written under
        ``reopen``). ``only``: a rebuild member keeps just the rows of its rebuild's day (its
        rows of other days are in those partitions already)."""
        if self._event_time is None or not rows.num_rows:
            groups: list[tuple[date | None, pa.RecordBatch]] = [(landing_day, rows)]
        else:
            days = _days(rows.column(self._event_time))
            if landing_day is not None:
                days = pc.fill_null(days, pa.scalar(landing_day, pa.date32()))
            groups = []
            for day in pc.unique(days).to_pylist():
                mask = pc.is_null(days) if day is None else pc.equal(days, day)
                groups.append((day, rows.filter(pc.fill_null(mask, False))))
        for day, part in sorted(groups, key=lambda g: (g[0] is None, g[0] or date.min)):
            if only is not None and day != only:
                continue
            if day is not None and part.num_rows:
                late = part.num_rows if day in self._completed and only is None else 0
                self._add(day.isoformat(), rows=part.num_rows, late_records=late)
            yield day, part

    def count_dead_letter(self, day: date | None) -> None:
        """A record rejected before its event time was known: its split's landing day."""
        if day is not None:
            self._add(day.isoformat(), dead_letters=1)

    def touch(self, day: date | None) -> None:
        """A split of ``day`` finished: the partition exists even if nothing was written."""
        if day is not None:
            self._add(day.isoformat())

    # -- checkpoint -----------------------------------------------------------------------

    def take_counts(self) -> dict[str, dict[str, int]]:
        """The counts since the last barrier (and start counting anew)."""
        counts, self._counts = self._counts, {}
        return counts

    def _add(self, day: str, **values: int) -> None:
        total = self._counts.setdefault(day, dict.fromkeys(COUNTERS, 0))
        for name, value in values.items():
            total[name] += value


def _days(times: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The UTC day of each timestamp (null stays null)."""
    if isinstance(times, pa.ChunkedArray):
        times = times.combine_chunks()
    # A zoned timestamp stores UTC instants: dropping the zone keeps the UTC wall time.
    return pc.cast(times.cast(pa.timestamp(times.type.unit)), pa.date32())
