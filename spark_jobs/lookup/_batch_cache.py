"""``BatchCache``: the partial lookup cache of :class:`~spark_jobs.lookup.BatchLookup`, per batch.

The semantics of :class:`~spark_jobs.lookup.LookupCache` (Flink's ``DefaultLookupCache``:
at most ``maximum_size`` rows, ``expire_after_write``/``expire_after_access``, cached misses),
but a batch's keys are answered with a handful of operations whatever their number, so that
a hit costs the worker far less than the query it replaces:

- a dict maps each cached key to the *position* of its row in a :class:`RowLog`
  (``_cache_rows``: the columns in Arrow, per-position flags and times in flat buffers);
  ``-position`` marks a cached miss. A lookup is one ``dict.get`` per key (a C ``map``), one
  list-to-Arrow conversion, a few compute calls and one ``take`` of the rows found;
- recency is a CLOCK reference bit per position, set for the hits the hand reaches soon
  (``_mark``) by one C ``map`` (no Python code per key, no rows moved); with
  ``expire_after_access`` the hits' access times are set the same way;
- eviction is CLOCK, vectorised: when the cache holds more than ``maximum_size`` rows, the
  hand sweeps the positions from where it stopped and evicts the live rows whose bit is clear
  (clearing the bits it passes: their second chance), the excess plus ``maximum_size / 64``
  at once (amortised). CLOCK approximates LRU: a row used since the hand last passed it
  survives the next sweep, an unused one goes in position (≈ insertion) order. This holds
  with ``expire_after_access`` too (before, that mode was an exact LRU);
- write expiry is a prefix of the positions (rows are appended in time order: the clock is
  monotonic), purged by a binary search; access expiry is one vectorised comparison of the
  access times per call.

One clock reading serves a whole call: a batch's rows share their write/access time.

Threading contract: not thread-safe. A cache belongs to one event loop thread (the mailbox
thread running the lookup function) and every method must be called from that thread.
"""

from __future__ import annotations

import time
from array import array
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import compress, repeat
from operator import not_
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.lookup._cache_options import CacheOptions
from spark_jobs.lookup._cache_rows import RowLog, as_float64, as_int64, as_uint8

__all__ = ["Answer", "BatchCache"]

BULK = 64  # an eviction frees maximum_size / BULK rows more than the excess (amortised)
REACH = 1024  # positions ahead of the CLOCK hand whose use is marked, at least


@dataclass(frozen=True, slots=True)
class Answer:
    """The cache's answer for a batch's distinct keys: ``found_at`` (int64 indices into the
    keys) of the keys cached with a row (ascending), ``values`` their rows (aligned with
    ``found_at``); ``missing_at`` the indices of keys the cache does not hold
    (None: none), ``missing`` those keys (in the keys' order)."""

    found_at: pa.Array
    values: tuple[pa.Array, ...]
    missing_at: pa.Array | None
    missing: list[Any]


class BatchCache(CacheOptions):
    """Partial cache of rows of ``value_types`` columns, answered per batch (module docstring).

    Counters (plain attributes): ``hits``/``misses`` (keys answered / not answered, cached
    misses are hits), ``loads`` (rows stored from the database, cached misses included),
    ``evictions`` (rows removed for size or expiry).
    """

    def __init__(
        self,
        maximum_size: int,
        value_types: Sequence[pa.DataType],
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
        self._types = tuple(value_types)
        self._index: dict[Any, int] = {}  # key -> its row's position (-position: a miss)
        self._log = self._new_log()
        self._hand = 1  # CLOCK: the position the next sweep starts from
        self._unexpired = 1  # write expiry: the positions below it are expired and purged

    def __len__(self) -> int:
        self._purge(self._clock())
        return len(self._index)

    def _new_log(self) -> RowLog:
        times = {"written"} if self.expire_after_write is not None else set()
        if self.expire_after_access is not None:
            times.add("accessed")
        return RowLog(self._types, frozenset(times))

    # -- lookups -------------------------------------------------------------------------

    def lookup(self, keys: list[Any]) -> Answer:
        """Answer the distinct ``keys`` (cache keys: a value, or a tuple of a composite key);
        the rows found are marked used (and accessed now)."""
        now = self._clock()
        self._purge(now)
        log = self._log
        # Step 1: one probe per key (0: not cached; position 0 is never a row), straight
        # into a C buffer that Arrow reads as is (no Python int converted one by one).
        where = array("q", map(self._index.get, keys, repeat(0)))
        positions = as_int64(where)
        # Step 2: the partition: rows found (> 0), cached misses (< 0), not cached (0).
        absent = where.count(0)
        missing_at: pa.Array | None = None
        missing: list[Any] = []
        if absent:
            at = list(compress(range(len(where)), map(not_, where)))
            missing_at = pa.array(at, pa.int64())
            missing = list(map(keys.__getitem__, at))
        self.hits += len(keys) - absent
        self.misses += absent
        # Step 3: recency (position 0 absorbs the keys not cached).
        self._mark(positions)
        if log.accessed is not None:
            deque(map(log.accessed.__setitem__, map(abs, where), repeat(now)), maxlen=0)
        found = pc.greater(positions, 0)
        found_at = pc.indices_nonzero(found)
        if not len(found_at):
            empty = pa.array([], pa.int64())
            return Answer(empty, tuple(pa.array([], t) for t in self._types), missing_at, missing)
        # Step 4: their rows, one take.
        return Answer(found_at, log.take(positions.filter(found)), missing_at, missing)

    def store(self, keys: list[Any], found_keys: list[Any], values: Sequence[pa.Array]) -> None:
        """Cache the rows the database returned for ``keys`` (``found_keys`` aligned with
        ``values``; the first row of a key found twice is the one kept, as the uncached join
        uses it), and the keys without a row as cached misses; without
        ``cache_missing_key`` those are forgotten instead (the database said they are gone)."""
        now = self._clock()
        self._purge(now)
        index, log = self._index, self._log
        known = set(found_keys)
        absent = [k for k in keys if k not in known]
        stored, columns = list(found_keys), list(values)
        if absent and self.cache_missing_key:
            stored += absent
            columns = [
                pa.concat_arrays([v, pa.nulls(len(absent), t)])
                for v, t in zip(columns, self._types, strict=True)
            ]
        elif absent:
            self._forget(absent)
        if not stored:
            return
        # Step 1: a key stored again: its old position becomes garbage.
        deque(map(log.live.__setitem__, map(abs, map(index.get, stored, repeat(0))), repeat(0)), 0)
        # Step 2: append; live flags say which position of a key found twice is its row.
        count, rows = len(stored), len(found_keys)
        live = bytearray(b"\1") * count
        if len(known) < rows:
            live[:rows] = _first_of_each(found_keys)
        start = log.append(stored, columns, bytes(live), now)
        # Step 3: index them (reversed: the first of a key found twice wins).
        index.update(zip(reversed(found_keys), range(start + rows - 1, start - 1, -1), strict=True))
        if len(stored) > rows:
            index.update(zip(absent, range(-(start + rows), -(start + count), -1), strict=True))
        self.loads += count
        self._shrink()

    def clear(self) -> None:
        """Forget every entry (counters are kept)."""
        self._index.clear()
        self._log = self._new_log()
        self._hand = self._unexpired = 1

    # -- eviction and expiry -------------------------------------------------------------

    def _mark(self, positions: pa.Array) -> None:
        """Set the CLOCK reference bits of the rows used that the hand reaches soon: within
        ``maximum_size / 4`` (at least ``REACH``) positions ahead of it, wrapping. Marking
        only those keeps the C loop short; a row used farther ahead is not marked, so it
        survives the sweep only if used again once near the hand (recent use: closer to LRU
        than a mark that waits out a whole sweep)."""
        log = self._log
        end = log.end
        hand = self._hand if self._hand < end else 1
        reach = hand + max(self.maximum_size // 4, REACH)
        at = pc.abs(positions)
        near = pc.and_(pc.greater_equal(at, hand), pc.less(at, reach))
        if reach > end:
            near = pc.or_(near, pc.less(at, reach - end + 1))
        deque(map(log.ref.__setitem__, at.filter(near).to_pylist(), repeat(1)), maxlen=0)

    def _forget(self, keys: list[Any]) -> None:
        """Drop ``keys`` (not an eviction: the database has no row for them)."""
        positions = map(abs, map(self._index.pop, keys, repeat(0)))
        deque(map(self._log.live.__setitem__, positions, repeat(0)), maxlen=0)

    def _shrink(self) -> None:
        """Evict beyond ``maximum_size``; fold the log's tail in, compact its garbage."""
        excess = len(self._index) - self.maximum_size
        if excess > 0:
            self._evict(min(excess + self.maximum_size // BULK, len(self._index)))
        log = self._log
        if log.garbage(len(self._index)):
            self._compact()
        elif log.wants_merge():
            log.merge()

    def _evict(self, count: int) -> None:
        """CLOCK: from the hand on, evict ``count`` live rows whose reference bit is clear,
        clearing the bits of the rows passed (a window of positions at a time, wrapping)."""
        log = self._log
        while count > 0:
            end = log.end
            hand = self._hand if self._hand < end else 1
            stop = min(end, hand + 8 * count + 1024)
            # Step 1: the candidates: live (1) and unreferenced (0), as offsets from the hand.
            candidates = pc.indices_nonzero(
                pc.greater(as_uint8(log.live, hand, stop), as_uint8(log.ref, hand, stop))
            )
            offsets = candidates.slice(0, count).to_pylist()
            # Step 2: the hand passes up to the last victim (or the window): second chances.
            last = hand + offsets[-1] if len(offsets) == count else stop - 1
            log.ref[hand : last + 1] = bytes(last + 1 - hand)
            self._hand = last + 1
            # Step 3: the victims leave the index.
            self._remove([hand + offset for offset in offsets])
            count -= len(offsets)

    def _remove(self, positions: list[int]) -> None:
        """Evict the live rows at ``positions`` (size or expiry)."""
        log = self._log
        deque(map(self._index.__delitem__, map(log.keys.__getitem__, positions)), maxlen=0)
        deque(map(log.live.__setitem__, positions, repeat(0)), maxlen=0)
        self.evictions += len(positions)

    def _purge(self, now: float) -> None:
        """Remove the expired rows: by write, the positions up to the last one written at
        or before ``now - expire_after_write`` (a prefix); by access, one comparison."""
        log = self._log
        if self.expire_after_write is not None:
            assert log.written is not None
            start = self._unexpired
            cut = bisect_right(log.written, now - self.expire_after_write, start, log.end)
            if cut > start:
                self._remove(list(compress(range(start, cut), log.live[start:cut])))
                self._unexpired = cut
        if self.expire_after_access is not None and log.end > 1:
            assert log.accessed is not None
            old = pc.less_equal(
                as_float64(log.accessed, 1, log.end), now - self.expire_after_access
            )
            live = pc.not_equal(as_uint8(log.live, 1, log.end), 0)
            expired = pc.indices_nonzero(pc.and_(old, live))
            if len(expired):
                self._remove([p + 1 for p in expired.to_pylist()])

    def _compact(self) -> None:
        """Drop the garbage positions; renumber the index, the hand and the expiry mark."""
        index, log = self._index, self._log
        kept = log.compact()
        self._index = {
            key: position if index[key] > 0 else -position
            for position, key in enumerate(log.keys[1:], 1)
        }
        self._hand = bisect_left(kept, self._hand) + 1
        self._unexpired = bisect_left(kept, self._unexpired) + 1


def _first_of_each(keys: list[Any]) -> bytearray:
    """1 for the first occurrence of each key, else 0."""
    seen: set[Any] = set()
    flags = bytearray(len(keys))
    for i, key in enumerate(keys):
        if key not in seen:
            seen.add(key)
            flags[i] = 1
    return flags
