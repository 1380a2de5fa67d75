"""A finished run's :class:`RunSummary`, from Postgres (a retried task's commits count too) and
the coordinator's checkpoint statistics."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import date

import sqlalchemy as sa

from enumerator_service import AbortCause
from spark_jobs.checkpoint import CoordinatorStats
from spark_jobs.jobs._heartbeat import run_totals
from spark_jobs.jobs._input_left import input_left
from spark_jobs.jobs._outages import while_down
from spark_jobs.jobs._results import SubtaskResult, lookup_totals, step_totals
from spark_jobs.jobs._summary import RunSummary, quantile

__all__ = ["summarize_run"]


def summarize_run(
    engine: sa.Engine,
    run_id: str,
    source: str,
    dates: Sequence[date] | None,
    results: list[SubtaskResult],
    stats: CoordinatorStats,
    *,
    rebuilt: tuple[date, ...],
    seconds: float,
    returned: int = 0,
) -> RunSummary:
    """``returned``: splits the run gave back unread after its subtasks ended (``InputLeft``)."""
    totals = while_down(lambda: run_totals(engine, run_id))
    left = while_down(lambda: input_left(engine, source, run_id, dates))
    left = dataclasses.replace(left, returned=returned)
    # A rebuild's records of other days were read but stay as first written: neither
    # input of the replaced day nor removed by a step.
    dropped = totals.dropped - totals.other_days
    rows_in = totals.rows + dropped + totals.dead_letters
    lookups = lookup_totals(results)
    durations = [c.duration for c in stats.completed]
    return RunSummary(
        pipeline=source,
        run_id=run_id,
        splits=totals.splits,
        rows_in=rows_in,
        rows_out=totals.rows,
        dropped=dropped,
        other_days=totals.other_days,
        dead_letters=totals.dead_letters,
        fenced=stats.aborted_by(AbortCause.FENCED),
        seconds=seconds,
        rows_per_second=rows_in / seconds if seconds > 0 else 0.0,
        nothing_new=False,
        lookups=lookups.lookups,
        lookup_queries=lookups.queries,
        cache_hit_rate=lookups.cache_hit_rate,
        cache_bypass_rate=lookups.cache_bypass_rate,
        cache_keys=lookups.cache_keys,
        lookup_p50_ms=lookups.p50_ms,
        lookup_p99_ms=lookups.p99_ms,
        checkpoints=len(stats.completed),
        checkpoints_aborted=len(stats.aborted),
        checkpoint_p50_ms=quantile(durations, 0.5) * 1e3,
        checkpoint_p99_ms=quantile(durations, 0.99) * 1e3,
        alignment_p50_ms=quantile([c.alignment for c in stats.completed], 0.5) * 1e3,
        rebuilt=tuple(day.isoformat() for day in rebuilt),
        steps=step_totals(results),
        left=left,
    )
