"""The task side of partition completeness: records split by event day (UTC), late records
found against the completed partitions, and the counts a checkpoint carries."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, date, datetime, timedelta, timezone

import orjson
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from spark_jobs.jobs._event_days import EventDays, refresh_in_background
from spark_jobs.runtime import MailboxClosedError
from spark_jobs.source._batch import OFFSET

D1, D2, D3 = date(2026, 1, 1), date(2026, 1, 2), date(2026, 1, 3)
_TS = pa.timestamp("us", tz="UTC")


def _rows(times: list[datetime | None]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {"ts": pa.array(times, _TS), "n": pa.array(range(len(times)), pa.int64())}
    )


def _at(day: date, hour: int, minute: int = 0) -> datetime:
    return datetime(day.year, day.month, day.day, hour, minute, tzinfo=UTC)


def test_one_landing_file_feeds_several_event_days() -> None:
    days = EventDays("ts", by_event_day=True, policy="reopen")
    rows = _rows([_at(D2, 0, 1), _at(D1, 23, 59), _at(D2, 12), None])
    parts = {day: part.column("n").to_pylist() for day, part in days.partitions(rows, D2)}
    # The null event time falls back to the landing day.
    assert parts == {D1: [1], D2: [0, 2, 3]}
    assert days.take_counts() == {
        "2026-01-01": {"rows": 1, "dead_letters": 0, "late_records": 0, "foreign_rows": 1},
        "2026-01-02": {"rows": 3, "dead_letters": 0, "late_records": 0, "foreign_rows": 0},
    }
    assert days.take_counts() == {}  # taken by the barrier: counting starts anew


def test_a_zoned_event_time_belongs_to_its_utc_day() -> None:
    days = EventDays("ts", by_event_day=True, policy="reopen")
    zoned = pa.array([datetime(2026, 1, 1, 22, 30, tzinfo=UTC)], pa.timestamp("us", "Etc/GMT+5"))
    rows = pa.RecordBatch.from_pydict({"ts": zoned})
    assert [day for day, _ in days.partitions(rows, None)] == [D1]


def test_without_event_day_partitions_the_landing_day_is_the_partition() -> None:
    days = EventDays("ts", by_event_day=False, policy="dead_letter", completed=frozenset({D1}))
    rows = _rows([_at(D1, 1), _at(D3, 1)])
    assert [(day, p.num_rows) for day, p in days.partitions(rows, D2)] == [(D2, 2)]
    assert days.late_rows(rows, rebuild=False) is None


def test_dead_letter_policy_marks_records_of_completed_days_late() -> None:
    days = EventDays("ts", by_event_day=True, policy="dead_letter", completed=frozenset({D1}))
    rows = _rows([_at(D1, 5), _at(D2, 5), None, _at(D1, 23)])
    late = days.late_rows(rows, rebuild=False)
    assert late is not None and late.to_pylist() == [True, False, False, True]
    assert days.late_rows(rows, rebuild=True) is None  # a rebuild rewrites a complete day
    assert days.late_rows(_rows([_at(D2, 1)]), rebuild=False) is None
    days.count_late_dead_letter(D1)
    assert days.take_counts() == {
        "2026-01-01": {"rows": 0, "dead_letters": 1, "late_records": 1, "foreign_rows": 0}
    }


def test_reopen_policy_writes_late_rows_and_counts_them() -> None:
    days = EventDays("ts", by_event_day=True, policy="reopen", completed=frozenset({D1}))
    rows = _rows([_at(D1, 5), _at(D2, 5)])
    assert days.late_rows(rows, rebuild=False) is None
    assert [(d, p.num_rows) for d, p in days.partitions(rows, D2)] == [(D1, 1), (D2, 1)]
    assert days.take_counts() == {
        "2026-01-01": {"rows": 1, "dead_letters": 0, "late_records": 1, "foreign_rows": 1},
        "2026-01-02": {"rows": 1, "dead_letters": 0, "late_records": 0, "foreign_rows": 0},
    }


def test_a_rebuild_member_writes_only_its_days_rows() -> None:
    days = EventDays("ts", by_event_day=True, policy="reopen", completed=frozenset({D1, D2}))
    rows = _rows([_at(D1, 5), _at(D2, 5), _at(D2, 6)])
    assert [(d, p.num_rows) for d, p in days.partitions(rows, D2, only=D2)] == [(D2, 2)]
    assert days.take_counts() == {}  # it replaces rows already counted


def test_completions_only_grow() -> None:
    days = EventDays("ts", by_event_day=True, policy="dead_letter", completed=frozenset({D1}))
    days.refresh(frozenset({D2}))  # a read that missed D1 cannot un-complete it
    assert days.completed == {D1, D2}


def test_dead_letters_and_finished_splits_count_on_their_landing_day() -> None:
    days = EventDays("ts", by_event_day=False, policy="reopen")
    days.split_added(1, D2, None)
    days.split_added(2, None, None)  # unpartitioned output: nothing to count
    days.split_added(3, D3, None)
    days.split_added(4, D1, 77)  # a rebuild member replaces counted output: not counted
    for split_id in (1, 2, 4):
        assert days.count_dead_letter(split_id, 0)  # 4's: a reader's, of its rebuild's day
    for split_id in (3, 4):
        days.touch(split_id)
    assert days.take_counts() == {
        "2026-01-02": {"rows": 0, "dead_letters": 1, "late_records": 0, "foreign_rows": 0},
        "2026-01-03": {"rows": 0, "dead_letters": 0, "late_records": 0, "foreign_rows": 0},
    }


def test_with_event_days_a_finished_split_creates_no_partition() -> None:
    days = EventDays("ts", by_event_day=True, policy="reopen")
    days.split_added(1, D2, None)
    days.touch(1)  # its landing day need not be an event day of any record
    assert days.take_counts() == {}


class RecordingSink:
    """Records what a sink writer is asked (extra unit test: the real writers are exercised
    by the Spark tests)."""

    def __init__(self) -> None:
        self.written: list[tuple[str, list[int]]] = []
        self.dead: list[tuple[int, int, dict[str, object], str]] = []
        self.dropped = 0

    def output_partition(self, day: date | None, rebuild_id: int | None) -> str:
        return f"dt={day}" if rebuild_id is None else f"rebuild-{rebuild_id}/dt={day}"

    def write_batch(self, partition: str, batch: pa.RecordBatch) -> None:
        assert OFFSET not in batch.schema.names
        self.written.append((partition, batch.column("n").to_pylist()))

    def dead_letter(self, split_id: int, offset: int, raw: bytes, reason: str) -> None:
        self.dead.append((split_id, offset, orjson.loads(raw), reason))

    def count_dropped(self, records: int) -> None:
        self.dropped += records


def _with_offsets(rows: pa.RecordBatch) -> pa.RecordBatch:
    return rows.append_column(OFFSET, pa.array([100 + i for i in range(rows.num_rows)]))


def test_writing_dead_letters_late_records_and_routes_the_rest_by_event_day() -> None:
    days = EventDays("ts", by_event_day=True, policy="dead_letter", completed=frozenset({D1}))
    days.split_added(5, D2, None)
    sink = RecordingSink()
    days.write(sink, _with_offsets(_rows([_at(D1, 9), _at(D2, 9), _at(D3, 1)])), 5)
    assert sink.written == [("dt=2026-01-02", [1]), ("dt=2026-01-03", [2])]
    assert [(s, o, r) for s, o, _raw, r in sink.dead] == [(5, 100, "late")]
    assert sink.dead[0][2]["n"] == 0 and OFFSET not in sink.dead[0][2]
    assert days.take_counts() == {
        "2026-01-01": {"rows": 0, "dead_letters": 1, "late_records": 1, "foreign_rows": 0},
        "2026-01-02": {"rows": 1, "dead_letters": 0, "late_records": 0, "foreign_rows": 0},
        "2026-01-03": {"rows": 1, "dead_letters": 0, "late_records": 0, "foreign_rows": 1},
    }


def test_a_rebuild_member_writes_its_day_and_counts_the_rest_as_dropped() -> None:
    days = EventDays("ts", by_event_day=True, policy="dead_letter", completed=frozenset({D1}))
    days.split_added(6, D1, 9)
    sink = RecordingSink()
    days.write(sink, _with_offsets(_rows([_at(D1, 9), _at(D2, 9), _at(D1, 10)])), 6)
    assert sink.written == [("rebuild-9/dt=2026-01-01", [0, 2])]
    assert (sink.dead, sink.dropped) == ([], 1)


_minutes = st.integers(min_value=0, max_value=3 * 24 * 60 - 1)


@given(
    st.lists(st.one_of(st.none(), _minutes), max_size=60),
    st.sets(st.sampled_from([D1, D2, D3])),
)
def test_every_record_lands_in_exactly_one_partition_of_its_utc_day(
    minutes: list[int | None], completed: set[date]
) -> None:
    start = _at(D1, 0)
    times = [None if m is None else start + timedelta(minutes=m) for m in minutes]
    days = EventDays("ts", by_event_day=True, policy="reopen", completed=frozenset(completed))
    seen: list[int] = []
    for day, part in days.partitions(_rows(times), D3):
        for n, t in zip(part.column("n").to_pylist(), part.column("ts").to_pylist(), strict=True):
            assert day == (D3 if t is None else t.astimezone(UTC).date())
            seen.append(n)
    assert sorted(seen) == list(range(len(times)))
    counts = days.take_counts()
    assert sum(c["rows"] for c in counts.values()) == len(times)
    late = sum(1 for t in times if (D3 if t is None else t.date()) in completed)
    assert sum(c["late_records"] for c in counts.values()) == late
    foreign = sum(1 for t in times if t is not None and t.date() != D3)
    assert sum(c["foreign_rows"] for c in counts.values()) == foreign


class RecordingMails:
    """Stands in for the mailbox executor: keeps the mails (or refuses, once closed)."""

    def __init__(self, closed: bool = False) -> None:
        self.mails: list[Callable[[], object]] = []
        self.closed = closed

    def execute(self, action: Callable[[], object], description: str = "mail") -> None:
        if self.closed:
            raise MailboxClosedError("closed")
        self.mails.append(action)


def test_completions_are_read_off_the_mailbox_thread_and_applied_as_a_mail(
    caplog: pytest.LogCaptureFixture,
) -> None:
    days = EventDays("ts", by_event_day=True, policy="dead_letter")
    mails = RecordingMails()
    with ThreadPoolExecutor(1) as io:
        refresh_in_background(days, io, mails, lambda: frozenset({D1}))  # type: ignore[arg-type]
    assert days.completed == frozenset()  # nothing changes until the mail runs
    (mail,) = mails.mails
    mail()
    assert days.completed == {D1}
    closed = RecordingMails(closed=True)
    with ThreadPoolExecutor(1) as io:  # a subtask that ended meanwhile: dropped quietly
        refresh_in_background(days, io, closed, lambda: frozenset({D2}))  # type: ignore[arg-type]
    assert days.completed == {D1}
    assert not caplog.records  # (a callback that raised would be logged by the executor)


def test_a_step_dead_letter_counts_on_the_records_event_day() -> None:
    """A dead letter of a step keeps the record as JSON (event time included): it counts on
    the record's event day, not on its file's landing day; a reader's dead letter (no
    record) and an unreadable event time fall back to the landing day."""
    days = EventDays("ts", by_event_day=True, policy="reopen")
    days.split_added(7, D2, None)
    # As the per-record and lookup steps keep a rejected record (orjson, 4 KiB at most).
    record = {"ts": datetime(2026, 1, 1, 22, 30, tzinfo=timezone(timedelta(hours=-5))), "n": 1}
    days.count_dead_letter(7, 0, orjson.dumps(record, default=str)[:4096])  # UTC: D2 03:30
    days.count_dead_letter(7, 0, orjson.dumps({"ts": _at(D3, 1), "n": 2}))
    days.count_dead_letter(7, 0)  # the reader's: the input did not parse
    for raw in (b'{"ts": null}', b'{"ts": "2026-01-01T01:00:00"}', b'{"ts": "bad"}', b"[1]"):
        days.count_dead_letter(7, 0, raw)
    days.count_dead_letter(7, 0, orjson.dumps({"ts": _at(D1, 5), "pad": "x" * 5000})[:4096])
    counts = {day: values["dead_letters"] for day, values in days.take_counts().items()}
    assert counts == {"2026-01-02": 7, "2026-01-03": 1}
    # Day D1 only in the untruncated record: counted there.
    days.count_dead_letter(7, 0, orjson.dumps({"ts": _at(D1, 5), "n": 3}))
    assert days.take_counts()["2026-01-01"]["dead_letters"] == 1


def test_dead_letters_without_event_day_partitions_count_on_the_landing_day() -> None:
    days = EventDays("ts", by_event_day=False, policy="reopen")
    days.split_added(7, D2, None)
    days.split_added(8, D2, 41)  # a rebuild member: replaces counted dead letters
    days.count_dead_letter(7, 0, orjson.dumps({"ts": _at(D3, 1)}))
    days.count_dead_letter(8, 0, orjson.dumps({"ts": _at(D3, 1)}))
    assert days.take_counts() == {
        "2026-01-02": {"rows": 0, "dead_letters": 1, "late_records": 0, "foreign_rows": 0}
    }


def test_a_rebuild_member_of_another_landing_day_writes_and_tallies_only_its_rebuild_day() -> None:
    """A file landing on D2 that fed D1: re-read for the rebuild of D1 it writes its D1 rows
    into the rebuild's folder and tallies them for the rebuild (foreign), keeps only its dead
    letters of D1, and counts nothing into the partitions' stats."""
    days = EventDays("ts", by_event_day=True, policy="dead_letter", completed=frozenset({D1}))
    days.split_added(6, D2, 9, D1)
    sink = RecordingSink()
    days.write(sink, _with_offsets(_rows([_at(D1, 9), _at(D2, 9), _at(D1, 10)])), 6)
    assert sink.written == [("rebuild-9/dt=2026-01-01", [0, 2])]
    assert (sink.dead, sink.dropped) == ([], 1)
    assert days.count_dead_letter(6, 7, orjson.dumps({"ts": _at(D1, 3)}))  # a step's, of D1
    assert not days.count_dead_letter(6, 8, orjson.dumps({"ts": _at(D2, 3)}))  # of D2: stays
    assert not days.count_dead_letter(6, 9)  # a reader's: its landing day D2, stays
    assert days.take_counts() == {}
    assert days.take_detail() == {
        "splits": {"2026-01-01": [6]},
        "rebuilds": {"9": {"rows": 2, "dead_letters": 1, "foreign_rows": 2}},
        "dead_letters": [[6, 7, "2026-01-01"]],
        # Its D2 row and two D2 dead letters: left as first written, not removed by a step.
        "other_days": 3,
    }
    assert days.take_detail() == {}  # taken: the next interval starts empty


def test_the_detail_records_which_splits_fed_which_day_and_each_dead_letters_day() -> None:
    days = EventDays("ts", by_event_day=True, policy="dead_letter", completed=frozenset({D1}))
    days.split_added(5, D2, None)
    sink = RecordingSink()
    days.write(sink, _with_offsets(_rows([_at(D1, 9), _at(D2, 9), _at(D3, 1)])), 5)
    assert days.count_dead_letter(5, 50)  # a reader's: on the landing day
    taken = days.take()
    assert taken["detail"] == {
        "splits": {"2026-01-01": [5], "2026-01-02": [5], "2026-01-03": [5]},
        "dead_letters": [[5, 100, "2026-01-01"], [5, 50, "2026-01-02"]],
    }
    assert taken["2026-01-02"] == {
        "rows": 1,
        "dead_letters": 1,
        "late_records": 0,
        "foreign_rows": 0,
    }


def test_a_fresh_member_writes_and_counts_its_other_days_as_a_first_reading() -> None:
    """A file of the rebuilt day that no run had read: its rows of the day go to the rebuild
    (tallied), its rows and dead letters of other days are written and counted as usual."""
    days = EventDays("ts", by_event_day=True, policy="reopen")
    days.split_added(6, D1, 9, D1, fresh=True)
    sink = RecordingSink()
    days.write(sink, _with_offsets(_rows([_at(D1, 9), _at(D2, 9), _at(D1, 10)])), 6)
    assert sink.written == [("rebuild-9/dt=2026-01-01", [0, 2]), ("dt=2026-01-02", [1])]
    assert sink.dropped == 0
    assert days.count_dead_letter(6, 8, orjson.dumps({"ts": _at(D2, 3)}))  # its first: kept
    assert days.take_counts() == {
        "2026-01-02": {"rows": 1, "dead_letters": 1, "late_records": 0, "foreign_rows": 1}
    }
    assert days.take_detail()["rebuilds"] == {
        "9": {"rows": 2, "dead_letters": 0, "foreign_rows": 0}
    }


def test_a_reader_dead_letter_of_a_split_without_a_landing_day_counts_on_the_readers_day() -> None:
    """A Kafka main line has no landing day: a message that did not decode counts on the day
    its reader gives it (the message's timestamp), so the day's dead_letter_ratio sees it —
    with event-day partitions only (an unpartitioned output has no days to count on)."""
    days = EventDays("ts", by_event_day=True, policy="reopen")
    days.split_added(3, None, None)
    assert days.count_dead_letter(3, 41, read_day=D2)
    assert days.count_dead_letter(3, 42)  # no day known: written, counted on no day
    # A step's dead letter keeps its record's event day, whatever the reader's day.
    assert days.count_dead_letter(3, 43, orjson.dumps({"ts": _at(D3, 1)}), read_day=D2)
    taken = days.take()
    assert taken["2026-01-02"]["dead_letters"] == 1
    assert taken["2026-01-03"]["dead_letters"] == 1
    assert taken["detail"]["dead_letters"] == [[3, 41, "2026-01-02"], [3, 43, "2026-01-03"]]
    # The landing day, when the split has one (a day split), wins over the reader's day.
    days.split_added(4, D1, None)
    assert days.count_dead_letter(4, 7, read_day=D2)
    assert days.take_counts()["2026-01-01"]["dead_letters"] == 1

    flat = EventDays("ts", by_event_day=False, policy="reopen")
    flat.split_added(3, None, None)
    assert flat.count_dead_letter(3, 41, read_day=D2)
    assert flat.take() == {}
