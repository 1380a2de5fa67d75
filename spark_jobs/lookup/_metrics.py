"""Lookup metrics: a log-bucketed latency histogram and an immutable metrics snapshot.

Threading contract: a :class:`LatencyHistogram` is not thread-safe; it belongs to the thread
that records into it (the mailbox thread for :class:`~spark_jobs.lookup.PostgresLookup`).
:class:`LookupMetrics` is an immutable snapshot and may be handed to any thread.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["LatencyHistogram", "LookupMetrics"]


class LatencyHistogram:
    """Latencies in seconds in log-spaced buckets: O(1) ``record`` (a binary search over a
    fixed set of about 520 bounds), bounded memory.

    Bucket ``i`` covers ``[lowest * growth**i, lowest * growth**(i+1))``; a quantile is
    reported as the bucket's geometric midpoint (clamped to the observed min/max), so its
    relative error is at most ``sqrt(growth) - 1`` (about 2.5% for the default 1.05) for
    values inside ``[lowest, highest]``. Values outside that range land in the first/last
    bucket; the extremes (q=0, q=1) are exact.
    """

    __slots__ = (
        "_bounds",
        "_counts",
        "_growth",
        "_last",
        "_lowest",
        "count",
        "max",
        "min",
        "total",
    )

    def __init__(self, *, lowest: float = 1e-7, highest: float = 1e4, growth: float = 1.05) -> None:
        if not 0 < lowest < highest:
            raise ValueError("need 0 < lowest < highest")
        if growth <= 1:
            raise ValueError("growth must be > 1")
        self._lowest = lowest
        self._growth = growth
        buckets = math.ceil(math.log(highest / lowest) / math.log(growth)) + 1
        # Bucket lower bounds, searched with bisect: the same bounds decide both the bucket
        # of a value and record_many's "same bucket as the previous value" shortcut.
        self._bounds = [lowest * math.pow(growth, i) for i in range(buckets + 1)]
        self._last = buckets - 1
        self._counts = [0] * buckets
        self.count = 0
        self.total = 0.0
        self.min = math.inf
        self.max = 0.0

    def _index(self, seconds: float) -> int:
        index = bisect_right(self._bounds, seconds) - 1
        return 0 if index < 0 else min(index, self._last)

    def record(self, seconds: float) -> None:
        """Add one observation (negative values, from clock jitter, count as 0)."""
        seconds = max(seconds, 0.0)
        self._counts[self._index(seconds)] += 1
        self.count += 1
        self.total += seconds
        if seconds < self.min:
            self.min = seconds
        if seconds > self.max:
            self.max = seconds

    def record_weighted(self, seconds: float, times: int) -> None:
        """Add ``times`` observations of ``seconds`` (the rows of one looked-up block)."""
        if times <= 0:
            return
        seconds = max(seconds, 0.0)
        self._counts[self._index(seconds)] += times
        self.count += times
        self.total += seconds * times
        self.min = min(self.min, seconds)
        self.max = max(self.max, seconds)

    def record_many(self, values: Sequence[float]) -> None:
        """Add a batch of observations: the same as ``record`` each, much cheaper.

        The latencies of one completed batch are close to each other, so most values fall
        into the previous value's bucket: two comparisons instead of a search.
        """
        if not values:
            return
        counts, bounds, last = self._counts, self._bounds, self._last
        low = high = 0.0  # the previous value's bucket range; empty at first
        index = run = 0
        for seconds in values:
            if low <= seconds < high:
                run += 1
                continue
            counts[index] += run
            run = 1
            index = bisect_right(bounds, seconds) - 1
            if index < 0:  # below the first bucket, including clock jitter below 0
                index, low, high = 0, -math.inf, bounds[0]
            elif index >= last:
                index, low, high = last, bounds[last], math.inf
            else:
                low, high = bounds[index], bounds[index + 1]
        counts[index] += run
        smallest = min(values)
        self.count += len(values)
        self.total += sum(values) if smallest >= 0 else sum(max(v, 0.0) for v in values)
        self.min = min(self.min, max(smallest, 0.0))
        self.max = max(self.max, max(values))

    def quantile(self, q: float) -> float:
        """The ``q``-quantile (nearest rank, 0 <= q <= 1) in seconds; 0.0 when empty."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile must be within [0, 1], got {q}")
        if self.count == 0:
            return 0.0
        rank = max(1, math.ceil(q * self.count))
        # The extremes are tracked exactly (they also cover values outside the bucket range).
        if rank == 1:
            return self.min
        if rank == self.count:
            return self.max
        seen = 0
        for index, n in enumerate(self._counts):
            seen += n
            if seen >= rank:
                mid = self._lowest * math.pow(self._growth, index + 0.5)
                return min(max(mid, self.min), self.max)
        return self.max  # unreachable: the counts sum to self.count

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0

    @property
    def p50(self) -> float:
        return self.quantile(0.5)

    @property
    def p99(self) -> float:
        return self.quantile(0.99)

    def reset(self) -> None:
        self._counts = [0] * len(self._counts)
        self.count = 0
        self.total = 0.0
        self.min = math.inf
        self.max = 0.0


@dataclass(frozen=True, slots=True)
class LookupMetrics:
    """A snapshot of one lookup function's counters.

    ``lookups`` counts async_invoke calls; ``batches`` queries sent; ``keys_queried`` the
    distinct keys in them (``mean_batch_size = keys_queried / batches``); ``rows_fetched``
    rows returned; ``cache_hits``/``cache_misses`` lookups answered / not answered by the
    cache (both 0 without a cache); ``cache_bypassed`` lookups that did not consult the
    partial cache because it did not pay for itself (``HitRateGuard``); ``p50_ms``/``p99_ms``
    the latency from async_invoke to completion of the lookups completed so far.
    """

    lookups: int
    batches: int
    keys_queried: int
    rows_fetched: int
    cache_hits: int
    cache_misses: int
    p50_ms: float
    p99_ms: float
    mean_batch_size: float
    cache_bypassed: int = 0
