"""HitRateGuard: a partial cache whose projected hit rate does not pay is bypassed, then sampled
again; a cold cache is judged by the rate it will have when full."""

from __future__ import annotations

import pyarrow as pa
import pytest

from spark_jobs.lookup._batch_cache import BatchCache
from spark_jobs.lookup._hit_rate_guard import HitRateGuard

TYPES = [pa.string(), pa.int64()]


def test_the_guard_bypasses_a_cache_whose_projected_rate_is_below_its_threshold() -> None:
    cache = BatchCache(100, TYPES)
    guard = HitRateGuard(0.5, window=100, pause=2)
    assert guard.consult(100)
    guard.record(0, 100, cache)  # nothing stored yet: not judged
    assert guard.consult(100)
    cache.loads = 40  # filled 0 -> 40 %: mean fill 20 %
    guard.record(5, 100, cache)  # 5 % hits at 20 % fill: 25 % when full, below 50 %
    assert [guard.consult(100), guard.consult(100), guard.consult(100)] == [False, False, True]
    assert guard.bypassed == 200
    cache.loads = 60  # 40 -> 60 %: mean 50 %
    guard.record(30, 100, cache)  # 30 % hits at half full: 60 % when full
    assert guard.consult(100) and guard.consult(100)
    cache.loads = 1_000  # full (loads past the size: evictions)
    guard.record(45, 100, cache)  # mean fill 80 %: 56 % projected, kept
    assert guard.consult(100)
    guard.record(40, 100, cache)  # full: 40 % as measured
    assert not guard.consult(100)
    with pytest.raises(ValueError, match="threshold"):
        HitRateGuard(1.5)


def test_a_cold_cache_with_a_low_rate_that_will_pay_is_not_bypassed() -> None:
    # Uniform keys over 1,000 values into a 500-row cache: a full cache hits 50 %; a cold
    # one hits in proportion to its fill. Judged by the raw rate, its first window (about
    # 8 % hits) would bypass a cache that pays; projected, it is kept.
    cache = BatchCache(500, TYPES)
    guard = HitRateGuard(0.3, window=100, pause=9)
    cache.loads = 160  # filled 0 -> 32 %: mean 16 %
    guard.record(8, 100, cache)
    assert guard.consult(100)


def test_each_verdict_against_the_cache_in_a_row_doubles_the_pause_up_to_its_bound() -> None:
    cache = BatchCache(100, TYPES)
    cache.loads = 100  # full: a window's rate is judged as measured
    guard = HitRateGuard(0.5, window=10, pause=2, max_pause=6)

    def pause_after(hits: int) -> int:
        """Windows bypassed after a sampled window with ``hits`` of its 10 keys."""
        guard.record(hits, 10, cache)
        skipped = 0
        while not guard.consult(10):  # (the consult that ends the loop starts a sample)
            skipped += 1
        return skipped

    assert guard.consult(10)
    assert [pause_after(0) for _ in range(4)] == [2, 4, 6, 6]  # doubled, then bounded
    assert pause_after(9) == 0  # a verdict for the cache resets the back-off
    assert pause_after(0) == 2
