"""What a reader subtask reports back to the driver (a typed value, pickled by Spark)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from spark_jobs.lookup import LookupMetrics

__all__ = ["StepMetrics", "SubtaskResult", "lookup_totals", "step_totals"]


@dataclass(frozen=True, slots=True)
class StepMetrics:
    """One step of one subtask: records in and out, retries and timeouts of its operator,
    and the lookup counters for a ``Lookup``."""

    index: int
    where: str
    records_in: int = 0
    records_out: int = 0
    retries: int = 0
    timeouts: int = 0
    lookup: LookupMetrics | None = None


@dataclass(frozen=True, slots=True)
class SubtaskResult:
    subtask: int
    attempt: str
    rows_written: int
    checkpoints_acked: int
    checkpoints_completed: int
    steps: tuple[StepMetrics, ...] = field(default=())


@dataclass(frozen=True, slots=True)
class LookupTotals:
    lookups: int
    queries: int
    cache_hit_rate: float
    p50_ms: float
    p99_ms: float
    cache_bypass_rate: float = 0.0
    #: Keys that met a cache: asked of it, or bypassing it (0: no Lookup step has a cache).
    cache_keys: int = 0


def lookup_totals(results: Sequence[SubtaskResult]) -> LookupTotals:
    """Lookup counters over every Lookup step of every subtask (latency quantiles: the
    worst subtask's)."""
    metrics = [s.lookup for r in results for s in r.steps if s.lookup is not None]
    lookups = sum(m.lookups for m in metrics)
    hits = sum(m.cache_hits for m in metrics)
    # Of the keys the cache was asked (distinct keys per batch for a partial cache, rows
    # for a full one): lookups counts rows, and rows repeat keys.
    asked = hits + sum(m.cache_misses for m in metrics)
    bypassed = sum(m.cache_bypassed for m in metrics)
    return LookupTotals(
        lookups=lookups,
        queries=sum(m.batches for m in metrics),
        cache_hit_rate=hits / asked if asked else 0.0,
        cache_bypass_rate=bypassed / (asked + bypassed) if bypassed else 0.0,
        cache_keys=asked + bypassed,
        p50_ms=max((m.p50_ms for m in metrics), default=0.0),
        p99_ms=max((m.p99_ms for m in metrics), default=0.0),
    )


def step_totals(results: list[SubtaskResult]) -> tuple[tuple[str, int, int], ...]:
    """(step, records in, records out) over the subtasks."""
    totals: dict[int, list[Any]] = {}
    for result in results:
        for step in result.steps:
            entry = totals.setdefault(step.index, [step.where, 0, 0])
            entry[1] += step.records_in
            entry[2] += step.records_out
    return tuple((w, i, o) for _, (w, i, o) in sorted(totals.items()))
