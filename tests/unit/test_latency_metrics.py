"""LatencyHistogram quantiles against exact nearest-rank quantiles of known distributions."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_jobs.lookup import LatencyHistogram, LookupMetrics

TOLERANCE = 0.05
QUANTILES = (0.0, 0.01, 0.25, 0.5, 0.9, 0.99, 0.999, 1.0)


def exact(values: list[float], q: float) -> float:
    """Nearest-rank quantile, the definition the histogram approximates."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


def assert_close(histogram: LatencyHistogram, values: list[float]) -> None:
    for q in QUANTILES:
        want = exact(values, q)
        got = histogram.quantile(q)
        assert abs(got - want) <= TOLERANCE * want, (q, got, want)


@pytest.mark.parametrize(
    "draw",
    [
        pytest.param(lambda r: r.uniform(0.001, 0.010), id="uniform-1-10ms"),
        pytest.param(lambda r: r.expovariate(1 / 0.002), id="exponential-2ms"),
        pytest.param(lambda r: r.lognormvariate(math.log(0.003), 1.0), id="lognormal-3ms"),
        pytest.param(lambda r: r.paretovariate(1.5) * 1e-4, id="pareto-heavy-tail"),
    ],
)
def test_quantiles_of_known_distributions(draw: object) -> None:
    rng = random.Random(42)
    values = [draw(rng) for _ in range(20_000)]  # type: ignore[operator]
    histogram = LatencyHistogram()
    for value in values:
        histogram.record(value)
    assert_close(histogram, values)
    assert histogram.count == len(values)
    assert histogram.mean == pytest.approx(sum(values) / len(values))
    assert histogram.p50 == histogram.quantile(0.5)
    assert histogram.p99 == histogram.quantile(0.99)


def test_a_constant_is_reported_exactly() -> None:
    histogram = LatencyHistogram()
    for _ in range(100):
        histogram.record(0.0042)
    # min/max clamp the bucket midpoint: a single value comes back exact.
    assert histogram.p50 == histogram.p99 == 0.0042


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(1e-6, 100.0), min_size=1, max_size=300), st.sampled_from(QUANTILES))
def test_relative_error_is_bounded(values: list[float], q: float) -> None:
    histogram = LatencyHistogram()
    for value in values:
        histogram.record(value)
    want = exact(values, q)
    assert abs(histogram.quantile(q) - want) <= TOLERANCE * want


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-1e-3, 10.0), max_size=100))
def test_record_many_equals_record_each(values: list[float]) -> None:
    one, many = LatencyHistogram(), LatencyHistogram()
    for value in values:
        one.record(value)
    many.record_many(values)
    assert (one.count, one.min, one.max) == (many.count, many.min, many.max)
    assert one.total == pytest.approx(many.total)
    for q in QUANTILES:
        assert one.quantile(q) == many.quantile(q)


def test_out_of_range_values_are_clamped_into_the_edge_buckets() -> None:
    histogram = LatencyHistogram(lowest=1e-3, highest=1.0)
    for value in (-0.5, 0.0, 1e-9, 50.0):
        histogram.record(value)
    assert histogram.min == 0.0  # negative clock jitter counts as 0
    assert histogram.max == 50.0
    assert histogram.quantile(0.0) == 0.0
    assert histogram.quantile(1.0) == 50.0


def test_empty_histogram_and_invalid_quantile() -> None:
    histogram = LatencyHistogram()
    assert histogram.quantile(0.5) == 0.0
    assert histogram.mean == 0.0
    with pytest.raises(ValueError, match="quantile"):
        histogram.quantile(1.5)
    histogram.record(1.0)
    histogram.reset()
    assert histogram.count == 0
    assert histogram.quantile(0.99) == 0.0


def test_lookup_metrics_is_an_immutable_snapshot() -> None:
    metrics = LookupMetrics(
        lookups=10,
        batches=2,
        keys_queried=8,
        rows_fetched=7,
        cache_hits=2,
        cache_misses=8,
        p50_ms=1.5,
        p99_ms=4.0,
        mean_batch_size=4.0,
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        metrics.lookups = 11  # type: ignore[misc]
