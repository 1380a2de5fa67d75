"""A bounded lookup cache with Flink's partial-cache semantics (``DefaultLookupCache``).

Entries expire ``expire_after_write`` seconds after they were put and/or
``expire_after_access`` seconds after they were last read or put; beyond ``maximum_size``
entries the least recently used one is evicted. With ``cache_missing_key`` (the default) a
lookup that found no row is cached too, so a hot unknown key does not hit the database on
every event.

Threading contract: not thread-safe. A cache belongs to one event loop thread (the mailbox
thread running the lookup function) and every method must be called from that thread.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from typing import Generic, TypeVar

from spark_jobs.lookup._cache_options import CacheOptions

__all__ = ["CacheHit", "LookupCache"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class CacheHit(Generic[V]):
    """A cache hit: ``row`` is the cached row, or None for a cached miss ("no such row").

    One instance is created per ``put`` and returned by every ``get`` of that entry, so a hit
    allocates nothing.
    """

    __slots__ = ("row",)

    def __init__(self, row: V | None) -> None:
        self.row = row

    def __repr__(self) -> str:
        return f"CacheHit({self.row!r})"


class _Entry(Generic[V]):
    __slots__ = ("accessed", "hit", "written")

    def __init__(self, hit: CacheHit[V], now: float) -> None:
        self.hit = hit
        self.written = now
        self.accessed = now


class LookupCache(CacheOptions, Generic[K, V]):
    """LRU cache of lookup results with optional write/access expiry. Every operation is O(1)
    (amortised: expired entries are removed as they reach the head of an ordering).

    Expiry is exact: an entry is expired once ``clock() - written >= expire_after_write`` or
    ``clock() - accessed >= expire_after_access``, and every public method first removes the
    expired entries, so ``len()`` and the counters never include them. The clock must not go
    backwards (``time.monotonic`` by default; tests inject a fake one).

    Counters (plain attributes, read them any time):
    ``hits`` (get found a live entry, including cached misses), ``misses`` (get found
    nothing), ``loads`` (entries put), ``evictions`` (entries removed for size or expiry;
    ``invalidate`` does not count, as in Guava).
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
        super().__init__(
            maximum_size,
            expire_after_write=expire_after_write,
            expire_after_access=expire_after_access,
            cache_missing_key=cache_missing_key,
            clock=clock,
        )
        self._expires = expire_after_write is not None or expire_after_access is not None
        # Least recently used first: get/put move an entry to the end.
        self._by_access: OrderedDict[K, _Entry[V]] = OrderedDict()
        # Oldest write first, kept only for expire_after_write: access order differs from
        # write order, and this second ordering lets expired writes be found at its head.
        self._by_write: OrderedDict[K, _Entry[V]] | None = (
            OrderedDict() if expire_after_write is not None else None
        )

    def __len__(self) -> int:
        if self._expires:
            self._purge(self._clock())
        return len(self._by_access)

    def get(self, key: K) -> CacheHit[V] | None:
        """The live entry of ``key`` (refreshing its access time), or None."""
        if self._expires:
            now = self._clock()
            self._purge(now)
            entry = self._by_access.get(key)
            if entry is None:
                self.misses += 1
                return None
            entry.accessed = now
        else:
            entry = self._by_access.get(key)
            if entry is None:
                self.misses += 1
                return None
        self._by_access.move_to_end(key)
        self.hits += 1
        return entry.hit

    def put(self, key: K, row: V | None) -> None:
        """Cache ``row`` for ``key`` (None: the key has no row).

        Without ``cache_missing_key`` a None row is not stored and removes any stale entry of
        the key instead: the database has just said the row is gone.
        """
        if row is None and not self.cache_missing_key:
            self.invalidate(key)
            return
        now = self._clock() if self._expires else 0.0
        if self._expires:
            self._purge(now)
        by_access = self._by_access
        entry = _Entry(CacheHit(row), now)
        if key in by_access:
            by_access.move_to_end(key)
        elif len(by_access) >= self.maximum_size:
            evicted, _ = by_access.popitem(last=False)
            if self._by_write is not None:
                del self._by_write[evicted]
            self.evictions += 1
        by_access[key] = entry
        if self._by_write is not None:
            self._by_write[key] = entry
            self._by_write.move_to_end(key)
        self.loads += 1

    def get_many(self, keys: Iterable[K]) -> list[CacheHit[V] | None]:
        """``get`` of each key in order, at one clock reading (a batch's lookups are one
        instant): the per-key work is a dictionary lookup and an LRU move."""
        now = 0.0
        if self._expires:
            now = self._clock()
            self._purge(now)
        lookup, touch = self._by_access.get, self._by_access.move_to_end
        track = self.expire_after_access is not None
        out: list[CacheHit[V] | None] = []
        found = 0
        for key in keys:
            entry = lookup(key)
            if entry is None:
                out.append(None)
                continue
            if track:
                entry.accessed = now
            touch(key)
            out.append(entry.hit)
            found += 1
        self.hits += found
        self.misses += len(out) - found
        return out

    def put_many(self, items: Iterable[tuple[K, V | None]]) -> None:
        """``put`` of each (key, row) in order, at one clock reading."""
        if not self.cache_missing_key:
            for key, row in items:
                self.put(key, row)
            return
        now = 0.0
        if self._expires:
            now = self._clock()
            self._purge(now)
        by_access, by_write = self._by_access, self._by_write
        limit = self.maximum_size
        for key, row in items:
            entry = _Entry(CacheHit(row), now)
            if key in by_access:
                by_access.move_to_end(key)
            elif len(by_access) >= limit:
                evicted, _ = by_access.popitem(last=False)
                if by_write is not None:
                    del by_write[evicted]
                self.evictions += 1
            by_access[key] = entry
            if by_write is not None:
                by_write[key] = entry
                by_write.move_to_end(key)
            self.loads += 1

    def invalidate(self, key: K) -> None:
        """Forget ``key`` (no-op when absent)."""
        if self._by_access.pop(key, None) is not None and self._by_write is not None:
            del self._by_write[key]

    def clear(self) -> None:
        """Forget every entry (counters are kept)."""
        self._by_access.clear()
        if self._by_write is not None:
            self._by_write.clear()

    def _purge(self, now: float) -> None:
        """Remove every expired entry: they sit at the heads of the two orderings."""
        by_access, by_write = self._by_access, self._by_write
        ttl = self.expire_after_access
        if ttl is not None:
            while by_access:
                key, entry = next(iter(by_access.items()))
                if now - entry.accessed < ttl:
                    break
                del by_access[key]
                if by_write is not None:
                    del by_write[key]
                self.evictions += 1
        ttl = self.expire_after_write
        if ttl is not None and by_write is not None:
            while by_write:
                key, entry = next(iter(by_write.items()))
                if now - entry.written < ttl:
                    break
                del by_write[key]
                del by_access[key]
                self.evictions += 1
