"""Lookup metrics: a log-bucketed latency histogram and an immutable metrics snapshot.

Threading contract: a :class:`LatencyHistogram` is not thread-safe; it belongs to the thread
that records into it (the mailbox thread for :class:`~spark_jobs.lookup.PostgresLookup`).
:class:`LookupMetrics` is an immutable snapshot and may be handed to any thread.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["LatencyHistogram", "LookupMetrics"]


class LatencyHistogram:
    """Latencies in seconds in log-spaced buckets: O(1) ``record``, bounded memory.

    Bucket ``i`` covers ``[lowest * growth**i, lowest * growth**(i+1))``; a quantile is
    reported as the bucket's geometric midpoint (clamped to the observed min/max), so its
    relative error is at most ``sqrt(growth) - 1`` (about 2.5% for the default 1.05) for
    values inside ``[lowest, highest]``. Values outside that range land in the first/last
    bucket (their min/max are still exact).
    """

    __slots__ = (
        "_counts",
        "_growth",
        "_inv_log_growth",
        "_last",
        "_log_lowest",
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
        self._log_lowest = math.log(lowest)
        self._inv_log_growth = 1.0 / math.log(growth)
        buckets = math.ceil((math.log(highest) - self._log_lowest) * self._inv_log_growth) + 1
        self._last = buckets - 1
        self._counts = [0] * buckets
        self.count = 0
        self.total = 0.0
        self.min = math.inf
        self.max = 0.0

    def record(self, seconds: float) -> None:
        """Add one observation (negative values, from clock jitter, count as 0)."""
        self.count += 1
        if seconds > self._lowest:
            index = int((math.log(seconds) - self._log_lowest) * self._inv_log_growth)
            self._counts[index if index < self._last else self._last] += 1
        else:
            seconds = max(seconds, 0.0)
            self._counts[0] += 1
        self.total += seconds
        if seconds < self.min:
            self.min = seconds
        if seconds > self.max:
            self.max = seconds

    def record_many(self, values: Sequence[float]) -> None:
        """Add a batch of observations: the same as ``record`` each, with less overhead."""
        if not values:
            return
        counts, log, lowest = self._counts, math.log, self._lowest
        log_lowest, inv, last = self._log_lowest, self._inv_log_growth, self._last
        clamped = 0.0
        for seconds in values:
            if seconds > lowest:
                index = int((log(seconds) - log_lowest) * inv)
                counts[index if index < last else last] += 1
            else:
                counts[0] += 1
                if seconds < 0:
                    clamped -= seconds  # undo the negative part in the total below
        self.count += len(values)
        self.total += sum(values) + clamped
        self.min = min(self.min, max(min(values), 0.0))
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
    cache (both 0 without a cache); ``p50_ms``/``p99_ms`` the latency from async_invoke to
    completion of the lookups completed so far.
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
