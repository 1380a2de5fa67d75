"""Idle subtasks never hold the run watermark (issue 21, 3): the rule, and a continuous run
over sparse input played on a virtual clock.

The shape that failed: a few subtasks, one small file per day arriving every few seconds;
each file is read between two barriers, so at nearly every barrier every subtask is idle. The
run watermark was the minimum over non-idle subtasks and, with none, stayed at -infinity (NULL
for 38 checkpoints in the trial): no day completed while the run lived.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from enumerator_service._completeness import END_OF_INPUT, NO_WATERMARK, partition_end
from enumerator_service._run_watermark import (
    SubtaskMark,
    all_idle,
    run_watermark,
    subtask_mark,
)

D1 = date(2026, 1, 1)
T1 = datetime(2026, 1, 1, 20, tzinfo=UTC)
T2 = datetime(2026, 1, 2, 23, tzinfo=UTC)
PROPERTY = settings(derandomize=True, database=None, deadline=None, max_examples=200)


def idle(mark: datetime | None) -> SubtaskMark:
    return subtask_mark({"watermark": None if mark is None else mark.isoformat(), "idle": True})


def test_every_open_subtask_idle_gives_the_greatest_watermark_their_sinks_reached() -> None:
    assert run_watermark([idle(T1), idle(T2)]) == T2
    assert run_watermark([idle(T1), idle(None)]) == T1
    # None ever reached one: no information (the stored run watermark stays).
    assert run_watermark([idle(None), idle(None)]) == NO_WATERMARK
    # Not while the run holds splits still to be read: an idle subtask is about to take
    # one, and its event time is unknown.
    assert all_idle([idle(T1), idle(T2)])
    assert run_watermark([idle(T1), idle(T2)], unread=True) == NO_WATERMARK
    # While a subtask is active the minimum over the active ones holds, as before: the
    # completion rule's split condition guards the days of unread splits.
    reading = subtask_mark({"watermark": T1.isoformat(), "idle": False})
    assert not all_idle([reading, idle(T2)])
    assert run_watermark([reading, idle(T2)], unread=True) == T1
    # One that has reached no watermark yet holds the run at -infinity, idle ones or not.
    fresh = subtask_mark({"watermark": None, "idle": False})
    assert run_watermark([fresh, idle(T2)]) == NO_WATERMARK


def test_a_closed_subtask_beside_idle_ones_does_not_end_the_runs_event_time() -> None:
    """A continuous subtask that idled out (final acknowledgement) while another is idle and
    may still get splits: +infinity would complete every day, the last one too."""
    closed = subtask_mark({"watermark": T2.isoformat(), "finished": True, "idle": True})
    assert closed.closed and not closed.idle
    assert run_watermark([closed, idle(T1)]) == T2
    assert run_watermark([closed, idle(None)]) == T2
    assert run_watermark([closed]) == END_OF_INPUT


# -- a sparse continuous run on a virtual clock ------------------------------------------------

DELAY = timedelta(seconds=1)
HOURS = (0.5, 12.0, 23.5)  # the records of a day's file


@dataclass
class SparseRun:
    """One file per day: registered and assigned at ``arrive[i]``; the first subtask free
    pulls it within ``poll`` and reads it in ``read[i]``; barriers every ``interval``."""

    subtasks: int
    interval: float
    arrive: list[float]
    read: list[float]
    poll: float
    pulled: list[float] = field(default_factory=list)
    done: list[float] = field(default_factory=list)

    def schedule(self) -> None:
        """Which subtask reads each file (the first one free), from when to when."""
        busy_until = [0.0] * self.subtasks
        self.owner: list[int] = []
        for i, arrival in enumerate(self.arrive):
            k = min(range(self.subtasks), key=lambda j: busy_until[j])
            start = max(arrival + self.poll, busy_until[k])
            busy_until[k] = start + self.read[i]
            self.pulled.append(start)
            self.done.append(start + self.read[i])
            self.owner.append(k)

    def snapshots(self, t: float) -> tuple[list[dict[str, Any]], bool]:
        """The subtasks' snapshots at a barrier at ``t``, and whether the run holds a split
        it has not read (assigned, not yet pulled)."""
        marks: list[datetime | None] = [None] * self.subtasks
        active = [False] * self.subtasks
        for i, day in enumerate(days(len(self.arrive))):
            k = self.owner[i]
            if self.done[i] <= t:
                mark = last_record(day) - DELAY
                current = marks[k]
                marks[k] = mark if current is None else max(current, mark)
            elif self.pulled[i] <= t:
                active[k] = True  # its new split has not moved its sink watermark yet
        unread = any(a <= t < p for a, p in zip(self.arrive, self.pulled, strict=True))
        snaps = [
            {"watermark": None if m is None else m.isoformat(), "idle": not a, "finished": False}
            for m, a in zip(marks, active, strict=True)
        ]
        return snaps, unread


def days(n: int) -> list[date]:
    return [D1 + timedelta(days=i) for i in range(n)]


def day_end(day: date) -> datetime:
    return partition_end(day)


def last_record(day: date) -> datetime:
    """The event time of the last record of ``day``'s file."""
    return day_end(day) - timedelta(hours=24 - HOURS[-1])


def play(run: SparseRun, until: float) -> list[tuple[float, datetime | None, set[date]]]:
    """Every barrier up to ``until``: (time, stored run watermark, days complete). A day
    completes when the stored watermark passed its end and its file is read (the completion
    rule's two conditions)."""
    stored: datetime | None = None
    complete: set[date] = set()
    out = []
    t = run.interval
    while t <= until:
        snaps, unread = run.snapshots(t)
        marks = [subtask_mark(s) for s in snaps]
        mark = run_watermark(marks, unread=unread and all_idle(marks))
        if NO_WATERMARK < mark < END_OF_INPUT:
            stored = mark if stored is None else max(stored, mark)
        for i, day in enumerate(days(len(run.arrive))):
            if stored is not None and stored >= day_end(day) and run.done[i] <= t:
                complete.add(day)
        out.append((t, stored, set(complete)))
        t += run.interval
    return out


@st.composite
def sparse_runs(draw: st.DrawFn) -> SparseRun:
    interval = draw(st.sampled_from([0.3, 0.5, 1.0]))
    poll = draw(st.floats(0.05, 1.0))
    n = draw(st.integers(3, 6))
    # Long gaps: each file is read and followed by idle barriers before the next arrives.
    gaps = draw(st.lists(st.floats(2.5, 6.0), min_size=n - 1, max_size=n - 1))
    arrive = [0.0]
    for gap in gaps:
        arrive.append(arrive[-1] + gap * interval + poll + 0.5)
    read = draw(st.lists(st.floats(0.001, 0.5), min_size=n, max_size=n))
    return SparseRun(draw(st.integers(1, 3)), interval, arrive, read, poll)


@PROPERTY
@given(sparse_runs())
def test_each_day_of_a_sparse_continuous_run_completes_while_it_runs(run: SparseRun) -> None:
    run.schedule()
    n = len(run.arrive)
    barriers = play(run, run.arrive[-1] + 10 * run.interval + 2)
    previous: datetime | None = None
    for t, stored, complete in barriers:
        # Never backwards, never past what the subtasks read.
        assert previous is None or (stored is not None and stored >= previous)
        previous = stored
        read = [day for i, day in enumerate(days(n)) if run.done[i] <= t]
        if stored is not None:
            newest = max(last_record(d) - DELAY for d in read)
            assert stored <= newest, (t, stored, read)
        # A day completes only once its file is read.
        assert complete <= set(read)
    for i, day in enumerate(days(n)[:-1]):
        # Day i completes before file i + 2 arrives: at the first barrier after file i + 1 is
        # read (every subtask idle then, nothing of the run unread).
        deadline = run.done[i + 1] + run.interval
        at = [complete for t, _, complete in barriers if t <= deadline + 1e-9]
        assert day in at[-1], (day, run, barriers)
    # The last day's event time has not passed: the run does not complete it.
    assert days(n)[-1] not in barriers[-1][2]
