"""``HitRateGuard``: a partial cache that does not pay for itself is bypassed, and sampled again.

Threading contract: that of the cache it guards (one event loop thread).
"""

from __future__ import annotations

from spark_jobs.lookup._batch_cache import BatchCache

__all__ = ["MIN_FILL", "HitRateGuard"]

#: Below this mean fill a window is not judged.
MIN_FILL = 0.01


class HitRateGuard:
    """Stops consulting a cache that does not pay for itself, and samples it again later.

    A lookup through the cache costs more than the query alone (the index probe, storing
    the rows fetched, eviction); a hit saves a few microseconds of query,
    transfer and decoding. Below ``threshold`` hits per key the cache costs more than it
    saves, so: the keys of ``window`` keys' worth of batches are counted, and at the end of
    each window its hit rate is *projected* to a full cache: divided by the window's mean
    fill (rows stored so far over ``maximum_size``, at most 1; the mean of its fill at start
    and end). A cache filling with uniformly drawn keys hits in proportion to its fill, so
    a cold cache's low rate is not mistaken for a cache that does not pay, and a cache that
    cannot pay is found within its first window instead of after it filled (filling it costs
    the most: every key is stored). When the projection is below ``threshold``, the next
    ``pause`` windows' worth of batches bypass the cache (neither consulted nor filled: a
    plain query), then one window samples it again; each verdict against it in a row doubles
    the pause, up to ``max_pause`` windows, and a verdict for it resets it (an exponential
    back-off: a cache that never pays costs a few windows of filling, then about
    ``1 / (max_pause + 1)`` of its full cost, while one whose keys turn hot is consulted
    again within ``max_pause`` windows). A window whose mean fill is below ``MIN_FILL`` is
    not judged (too little seen). Windows are short (4,096 keys, two blocks of a clickstream
    file) so that the first verdict comes before much of the cache was filled for nothing.

    Threading contract: that of its cache (one event loop thread).
    """

    __slots__ = (
        "_against", "_fill", "_hits", "_keys", "_skip", "bypassed", "max_pause", "pause",
        "threshold", "window",
    )  # fmt: skip

    def __init__(
        self, threshold: float, *, window: int = 4_096, pause: int = 9, max_pause: int = 72
    ) -> None:
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"threshold must be within [0, 1], got {threshold}")
        self.threshold, self.window = threshold, window
        self.pause, self.max_pause = pause, max(pause, max_pause)
        self._against = 0  # verdicts against the cache in a row
        self._hits = self._keys = 0
        self._skip = 0  # keys still to bypass
        self._fill = 0.0  # the cache's fill when this window started
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
        size = cache.maximum_size
        fill = min(1.0, cache.loads / size) if size > 0 else 1.0
        mean, self._fill = (self._fill + fill) / 2, fill
        if mean < MIN_FILL:
            return
        if rate / mean >= self.threshold:
            self._against = 0
            return
        pause = min(self.pause << min(self._against, 16), self.max_pause)
        self._against += 1
        self._skip = pause * self.window
