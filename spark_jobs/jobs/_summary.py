"""What a run reports: :class:`RunSummary`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from spark_jobs._outcomes import ExitCode, run_exit_code
from spark_jobs.jobs._input_left import InputLeft

__all__ = ["RunSummary", "quantile"]


@dataclass(frozen=True)
class RunSummary:
    """One run of one pipeline. ``rows_in`` = ``rows_out`` + ``dropped`` (removed by steps)
    + ``dead_letters``; ``steps``: (step, records in, records out) per step; ``left``: the
    input of the run's scope it did not read (quarantined, held elsewhere).
    ``nothing_new``: no split was assigned to the run (``left`` says whether input waits)."""

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
    #: Share of the keys looked up without consulting the partial cache (it did not pay).
    cache_bypass_rate: float = 0.0
    #: Keys that met a partial or full cache (0: no Lookup step has one).
    cache_keys: int = 0
    lookup_p50_ms: float = 0.0
    lookup_p99_ms: float = 0.0
    checkpoints: int = 0
    checkpoints_aborted: int = 0
    checkpoint_p50_ms: float = 0.0
    checkpoint_p99_ms: float = 0.0
    alignment_p50_ms: float = 0.0
    #: Records of other days a ``--replace`` re-read and left as first written (not in
    #: ``rows_in``).
    other_days: int = 0
    #: Partitions (ISO dates) whose output this run replaced.
    rebuilt: tuple[str, ...] = ()
    steps: tuple[tuple[str, int, int], ...] = ()
    left: InputLeft = field(default_factory=InputLeft)

    @classmethod
    def nothing(
        cls, pipeline: str, run_id: str, seconds: float, left: InputLeft | None = None
    ) -> RunSummary:
        """A run that found no split to process (``left``: input that waits all the same)."""
        return cls(pipeline, run_id, 0, 0, 0, 0, 0, seconds, 0.0, True, left=left or InputLeft())

    @property
    def exit_code(self) -> ExitCode:
        """0, or 3 with quarantined input, or 4 with input held elsewhere (``_outcomes``)."""
        left = self.left
        return run_exit_code(quarantined=len(left.quarantined), held=left.unread)


def quantile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
