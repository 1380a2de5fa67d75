"""``bench/e2e.py``: end-to-end latency of the stream sources — percentiles and the verdict.

A continuous run at a steady input rate; each record's time from produce (or commit, for
CDC) to visible in the committed output is one sample. The target (the issue's): p99 <= the
pipeline's checkpoint interval + 1 s.
"""

from __future__ import annotations

from dataclasses import dataclass

from _harness import verdict_line

__all__ = ["Latency", "latency_verdict", "percentile"]

SLACK_SECONDS = 1.0  # target: p99 <= checkpoint interval + this


def percentile(samples: list[float], share: float) -> float:
    """The nearest-rank percentile (``share`` in 0..1) of ``samples`` (not empty)."""
    ordered = sorted(samples)
    rank = max(1, min(len(ordered), round(share * len(ordered) + 0.5)))
    return ordered[rank - 1]


@dataclass
class Latency:
    """What a latency run measured (seconds)."""

    name: str  # e.g. "CDC: commit -> visible in the sink"
    samples: list[float]
    rate: float  # records/s offered
    seconds: float  # how long they were offered
    interval: float  # the pipeline's checkpoint interval
    load: tuple[float, float, float]
    note: str = ""

    @property
    def p50(self) -> float:
        return percentile(self.samples, 0.50)

    @property
    def p99(self) -> float:
        return percentile(self.samples, 0.99)


def latency_verdict(latency: Latency | None, name: str) -> str:
    if latency is None or not latency.samples:
        return verdict_line(None, f"{name} latency p99 <= checkpoint interval + 1 s (not measured)")
    target = latency.interval + SLACK_SECONDS
    load = " ".join(f"{x:.2f}" for x in latency.load)
    return verdict_line(
        latency.p99 <= target,
        f"{latency.name}: p50 {latency.p50:.2f} s, p99 {latency.p99:.2f} s, max "
        f"{max(latency.samples):.2f} s over {len(latency.samples):,} records at "
        f"{latency.rate:,.0f}/s for {latency.seconds:.0f} s (target p99 <= checkpoint interval "
        f"{latency.interval:g} s + {SLACK_SECONDS:g} s = {target:g} s; load {load})"
        + (f"; {latency.note}" if latency.note else ""),
    )
