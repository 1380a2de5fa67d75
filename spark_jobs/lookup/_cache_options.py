"""``CacheOptions``: the options and counters both partial caches share, checked in one place.

:class:`~spark_jobs.lookup.LookupCache` (per row) and
:class:`~spark_jobs.lookup._batch_cache.BatchCache` (per batch) implement Flink's
``DefaultLookupCache`` semantics with the same options; this base class validates them
(fails fast with one line naming the option) and holds the counters.

Threading contract: that of the cache (one event loop thread).
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["CacheOptions"]


class CacheOptions:
    """``maximum_size`` rows, ``expire_after_write``/``expire_after_access`` seconds (None:
    never), ``cache_missing_key`` (cache "no such row" too), ``clock`` (monotonic seconds;
    tests inject a fake one).

    Counters (plain attributes, read them any time): ``hits`` (lookups answered, cached misses
    included), ``misses`` (not answered), ``loads`` (entries stored), ``evictions`` (entries
    removed for size or expiry).
    """

    def __init__(
        self,
        maximum_size: int,
        *,
        expire_after_write: float | None = None,
        expire_after_access: float | None = None,
        cache_missing_key: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if maximum_size < 1:
            raise ValueError(f"maximum_size must be at least 1, got {maximum_size}")
        for name, value in (
            ("expire_after_write", expire_after_write),
            ("expire_after_access", expire_after_access),
        ):
            if value is not None and value < 0:
                raise ValueError(f"{name} must not be negative, got {value}")
        self.maximum_size = maximum_size
        self.expire_after_write = expire_after_write
        self.expire_after_access = expire_after_access
        self.cache_missing_key = cache_missing_key
        self._clock = clock
        self.hits = 0
        self.misses = 0
        self.loads = 0
        self.evictions = 0
