"""The run watermark of a completed checkpoint: the minimum over its active subtasks' sink
watermarks, closed subtasks counting as +infinity and subtasks without a watermark holding it
at -infinity, idle ones left out — and, when every open subtask is idle and the run holds
nothing unread, the greatest watermark their sinks reached; and the end of an output
partition (a UTC day)."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from enumerator_service._completeness import (
    DETAIL,
    END_OF_INPUT,
    NO_WATERMARK,
    merge_partition_counts,
    partition_end,
)
from enumerator_service._run_watermark import SubtaskMark, run_watermark, subtask_mark

_T = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def _wm(snapshot: dict[str, Any], *, final: bool = False) -> datetime:
    """What a subtask contributes to the minimum while active."""
    return subtask_mark(snapshot, final=final).watermark


def _active(mark: datetime) -> SubtaskMark:
    return SubtaskMark(mark)


def test_a_snapshot_watermark_is_parsed_as_utc() -> None:
    assert _wm({"watermark": "2026-01-02T03:04:05+00:00"}) == _T
    plus_one = "2026-01-02T04:04:05+01:00"
    assert _wm({"watermark": plus_one}) == _T
    assert _wm({"watermark": plus_one}).tzinfo == UTC


def test_a_subtask_without_a_watermark_holds_the_run_at_minus_infinity() -> None:
    assert _wm({}) is NO_WATERMARK
    assert _wm({"watermark": None, "finished": False}) is NO_WATERMARK
    never = subtask_mark({"watermark": None})
    assert run_watermark([_active(_T), never]) == NO_WATERMARK


def test_a_finished_subtask_counts_as_plus_infinity() -> None:
    # Either marker of an ended input: the watermark part's snapshot flag, or a final ack.
    assert _wm({"watermark": None, "finished": True}) is END_OF_INPUT
    assert _wm({"watermark": _T.isoformat()}, final=True) is END_OF_INPUT
    closed = SubtaskMark(closed=True)
    assert run_watermark([closed, _active(_T)]) == _T
    # Input ended but records still in the chain: they commit later, the watermark stays.
    in_flight = {"watermark": _T.isoformat(), "finished": True, "splits": [{"pending": [[1, 2]]}]}
    assert _wm(in_flight) == _T
    drained = {"watermark": _T.isoformat(), "finished": True, "splits": [{"pending": []}]}
    assert _wm(drained) is END_OF_INPUT
    assert run_watermark([closed, closed]) == END_OF_INPUT


def test_no_open_subtask_means_every_channel_is_closed() -> None:
    assert run_watermark([]) == END_OF_INPUT


def test_an_idle_subtask_does_not_hold_the_run_back() -> None:
    idle = subtask_mark({"watermark": None, "idle": True})
    assert idle.idle
    assert run_watermark([idle, _active(_T)]) == _T
    # Only idle subtasks that never reached a watermark: no new information.
    assert run_watermark([idle, idle]) == NO_WATERMARK
    # Finished wins over idle.
    assert _wm({"idle": True, "finished": True}) is END_OF_INPUT
    assert not subtask_mark({"idle": True, "finished": True}).idle


def test_an_idle_drained_subtask_has_reached_its_splits_greatest_watermark() -> None:
    # A quiet topic's split (its last event 05-02 23:58) went idle after the subtask's other
    # split (05-03 11:58), so the sink's markers stopped at 05-02 23:58. Idle with nothing
    # in its chain, every record both emitted is at the sink: it has reached 05-03 11:58,
    # and a run whose subtasks are all so passes 05-03 00:00 (05-02 completes).
    low, high = datetime(2026, 5, 2, 23, 58, tzinfo=UTC), datetime(2026, 5, 3, 11, 58, tzinfo=UTC)
    split_states = [{"watermark": low.isoformat()}, {"watermark": high.isoformat()}]
    quiet = {"watermark": low.isoformat(), "idle": True, "splits": split_states}
    assert subtask_mark(quiet).reached == high
    assert run_watermark([subtask_mark(quiet), subtask_mark(quiet)]) == high
    assert run_watermark([subtask_mark(quiet), _active(low)]) == low  # the min of the active
    # Not idle, or records still pending (re-read after a restore): its sink's marker only.
    assert subtask_mark({**quiet, "idle": False}).reached == low
    pending = [{"watermark": high.isoformat(), "pending": [[3, 9]]}]
    assert subtask_mark({**quiet, "splits": pending}).reached == low
    # A split without a watermark yet adds nothing.
    assert subtask_mark({**quiet, "splits": [{"watermark": None}]}).reached == low


def test_a_subtask_stopped_in_a_stream_closes_at_the_watermark_it_reached() -> None:
    """A bounded run's Kafka or slot offsets are a piece of a stream that goes on: the run's
    end does not complete the day it stopped in (the next run's records of it would be late)."""
    low, high = datetime(2026, 5, 2, 5, 49, tzinfo=UTC), datetime(2026, 5, 2, 9, 0, tzinfo=UTC)
    split_states = [{"watermark": low.isoformat()}, {"watermark": high.isoformat()}]
    stopped = {"watermark": low.isoformat(), "finished": True, "stream": True}
    mark = subtask_mark({**stopped, "splits": split_states})
    assert mark.closed and mark.stopped and mark.watermark == high  # (its splits' greatest)
    assert subtask_mark({**stopped, "stream": False}).watermark is END_OF_INPUT
    assert subtask_mark({"watermark": low.isoformat(), "stream": True}, final=True).stopped
    other = subtask_mark({"watermark": low.isoformat(), "finished": True, "stream": True})
    # Every subtask closed: the least a stopped one reached (a file subtask's +infinity and
    # a stopped one without a watermark say nothing).
    empty = subtask_mark({"watermark": None, "finished": True, "stream": True})
    assert run_watermark([mark, other, SubtaskMark(closed=True), empty]) == low
    assert run_watermark([empty, SubtaskMark(closed=True)]) == NO_WATERMARK
    # While another subtask reads on, a stopped one holds the run at what it reached.
    assert run_watermark([mark, _active(high + timedelta(hours=1))]) == high
    assert run_watermark([empty, _active(high)]) == high
    # A Kafka day split of 05-02 (its day's whole range): read, it reached 05-03 00:00.
    day = subtask_mark({**stopped, "day_end": "2026-05-03T00:00:00+00:00"})
    assert day.watermark == datetime(2026, 5, 3, tzinfo=UTC)


def test_a_watermark_without_time_zone_is_refused() -> None:
    with pytest.raises(ValueError, match="no time zone"):
        subtask_mark({"watermark": "2026-01-02T03:04:05"})


_instants = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
)
_snapshots = st.one_of(
    _instants.map(lambda t: {"watermark": t.isoformat(), "finished": False}),
    st.just({"watermark": None, "finished": False}),
    _instants.map(lambda t: {"watermark": t.isoformat(), "finished": True}),
    st.just({"watermark": None, "finished": True}),
)


@given(st.lists(_snapshots, min_size=1, max_size=8), st.randoms())
def test_the_run_watermark_is_the_minimum_whatever_the_order(
    snapshots: list[dict[str, object]], rnd: object
) -> None:
    marks = [subtask_mark(s) for s in snapshots]
    shuffled = list(marks)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    result = run_watermark(shuffled)
    assert result == run_watermark(marks)
    open_marks = [m.watermark for s, m in zip(snapshots, marks, strict=True) if not s["finished"]]
    if not open_marks:
        assert result == END_OF_INPUT
    elif any(s["watermark"] is None for s in snapshots if not s["finished"]):
        assert result == NO_WATERMARK
    else:
        assert result == min(
            datetime.fromisoformat(str(s["watermark"])) for s in snapshots if not s["finished"]
        )
    # Never above any open subtask's watermark: a day cannot complete ahead of a subtask.
    assert all(result <= m for m in open_marks)


@given(st.dates(min_value=date(2000, 1, 1), max_value=date(2100, 1, 1)))
def test_a_day_ends_at_the_next_midnight_utc(day: date) -> None:
    end = partition_end(day)
    assert end.tzinfo == UTC and end.time().isoformat() == "00:00:00"
    assert end.date() == day + timedelta(days=1)
    last_instant = end - timedelta(microseconds=1)
    assert last_instant.date() == day
    other_zone = end.astimezone(timezone(timedelta(hours=-5)))
    assert other_zone == end


def test_partition_counts_merge_by_day_and_counter() -> None:
    total: dict[str, dict[str, int]] = {}
    merge_partition_counts(total, {"2026-01-01": {"rows": 2, "late_records": 1}})
    merge_partition_counts(total, {"2026-01-01": {"rows": 3, "dead_letters": 4}})
    merge_partition_counts(total, None)
    assert total == {
        "2026-01-01": {"rows": 5, "dead_letters": 4, "late_records": 1, "foreign_rows": 0}
    }
    with pytest.raises(ValueError, match="yesterday"):
        merge_partition_counts(total, {"yesterday": {"rows": 1}})


def test_partition_counts_merge_their_detail_apart_from_the_days() -> None:
    """The detail of several transactions (splits per day, rebuild tallies, dead letters'
    days) merges into one, never into a day's counters."""
    total: dict[str, dict[str, Any]] = {}
    merge_partition_counts(
        total,
        {
            "2026-01-01": {"rows": 1},
            DETAIL: {
                "splits": {"2026-01-01": [3, 1]},
                "rebuilds": {"7": {"rows": 2, "dead_letters": 1}},
                "dead_letters": [[3, 10, "2026-01-01"]],
            },
        },
    )
    merge_partition_counts(
        total,
        {
            DETAIL: {
                "splits": {"2026-01-01": [1, 2], "2026-01-02": [2]},
                "rebuilds": {"7": {"rows": 3, "foreign_rows": 1}},
                "dead_letters": [[2, 5, "2026-01-02"]],
            }
        },
    )
    assert total == {
        "2026-01-01": {"rows": 1, "dead_letters": 0, "late_records": 0, "foreign_rows": 0},
        DETAIL: {
            "splits": {"2026-01-01": [1, 2, 3], "2026-01-02": [2]},
            "rebuilds": {"7": {"rows": 5, "dead_letters": 1, "foreign_rows": 1}},
            "dead_letters": [[3, 10, "2026-01-01"], [2, 5, "2026-01-02"]],
        },
    }
