"""What a run reports: :class:`RunSummary`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["RunSummary", "quantile"]


@dataclass(frozen=True)
class RunSummary:
    """One run of one pipeline. ``rows_in`` = ``rows_out`` + ``dropped`` (removed by steps)
    + ``dead_letters``; ``steps``: (step, records in, records out) per step."""

    pipeline: str
    run_id: str
    splits: int
    rows_in: int
    rows_out: int
    dead_letters: int
    fenced: int
    seconds: float
    rows_per_second: float
    nothing_new: bool
    dropped: int = 0
    lookups: int = 0
    lookup_queries: int = 0
    cache_hit_rate: float = 0.0
    lookup_p50_ms: float = 0.0
    lookup_p99_ms: float = 0.0
    checkpoints: int = 0
    checkpoints_aborted: int = 0
    checkpoint_p50_ms: float = 0.0
    checkpoint_p99_ms: float = 0.0
    alignment_p50_ms: float = 0.0
    #: Partitions (ISO dates) whose output this run replaced.
    rebuilt: tuple[str, ...] = ()
    steps: tuple[tuple[str, int, int], ...] = ()

    @classmethod
    def nothing(cls, pipeline: str, run_id: str, seconds: float) -> RunSummary:
        """A run that found no split to process."""
        return cls(pipeline, run_id, 0, 0, 0, 0, 0, seconds, 0.0, True)


def quantile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
