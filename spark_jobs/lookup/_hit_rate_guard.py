"""``HitRateGuard``: a partial cache that does not pay for itself is bypassed, and sampled again.

Threading contract: that of the cache it guards (one event loop thread).
"""

from __future__ import annotations

from spark_jobs.lookup._batch_cache import BatchCache

__all__ = ["HitRateGuard"]


class HitRateGuard:
    """Stops consulting a cache that does not pay for itself, and samples it again later.

    A lookup through the cache costs about a microsecond per key more than the query alone
    (a dict probe, Arrow conversions, eviction); a hit saves a few microseconds of query,
    transfer and decoding. Below ``threshold`` hits per key the cache costs more than it
    saves, so: the keys of ``window`` keys' worth of batches are counted; when a window's
    hit rate is below ``threshold`` and the cache was warm when the window started (it had
    stored at least half its ``maximum_size``: a cold cache hits little whatever the keys), the
    next ``pause``
    windows' worth of batches bypass the cache (neither consulted nor filled: a plain query),
    then one window samples it again. A cache whose hit rate never reaches ``threshold``
    thus costs ``1 / (pause + 1)`` of its full cost.

    Threading contract: that of its cache (one event loop thread).
    """

    __slots__ = ("_hits", "_keys", "_skip", "_warm", "bypassed", "pause", "threshold", "window")

    def __init__(self, threshold: float, *, window: int = 16_384, pause: int = 9) -> None:
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"threshold must be within [0, 1], got {threshold}")
        self.threshold, self.window, self.pause = threshold, window, pause
        self._hits = self._keys = 0
        self._skip = 0  # keys still to bypass
        self._warm = False  # the cache was warm when this window started
        self.bypassed = 0  # keys looked up without the cache (a counter)

    def consult(self, keys: int) -> bool:
        """Whether a batch of ``keys`` distinct keys goes through the cache."""
        if self._skip > 0:
            self._skip -= keys
            self.bypassed += keys
            return False
        return True

    def record(self, hits: int, keys: int, cache: BatchCache) -> None:
        """Count a consulted batch's hits; at the end of a window, decide."""
        self._hits += hits
        self._keys += keys
        if self._keys < self.window:
            return
        rate = self._hits / self._keys
        self._hits = self._keys = 0
        if rate < self.threshold and self._warm:
            self._skip = self.pause * self.window
        self._warm = cache.loads >= cache.maximum_size // 2
