"""``BatchCache``: the partial lookup cache of :class:`~spark_jobs.lookup.BatchLookup`, per batch.

The semantics of :class:`~spark_jobs.lookup.LookupCache` (Flink's ``DefaultLookupCache``:
at most ``maximum_size`` rows, ``expire_after_write``/``expire_after_access``, cached misses),
but a batch's keys are answered with a handful of Arrow calls whatever their number, so that
a hit costs the worker far less than the query it replaces:

- a :class:`~spark_jobs.lookup._cache_index.KeyIndex` maps each cached key (one Arrow array:
  ``cache_keys``) to the *position* of its row in a :class:`RowLog` (``_cache_rows``: the
  columns in Arrow, per-position flags and times in flat buffers); ``-position`` marks a
  cached miss. A lookup probes the batch's rows themselves (duplicates and null keys
  included) with ``search_sorted``: no Python object per key, no distinct keys to join back.
  Its :class:`Answer` is each row's position and the log's batches as they were, so the
  rows found and those the database returns for the rest are joined to the batch by one
  ``take`` (``Answer.rows``);
- recency is a CLOCK reference bit per position, set for the hits the hand reaches soon
  (``_mark``) by one C ``map`` (no Python code per key, no rows moved); with
  ``expire_after_access`` the hits' access times are set the same way;
- eviction is CLOCK, vectorised: when the cache holds more than ``maximum_size`` rows, the
  hand sweeps the positions from where it stopped and evicts the live rows whose bit is clear
  (clearing the bits it passes: their second chance), the excess plus ``maximum_size / 64``
  at once (amortised). CLOCK approximates LRU: a row used since the hand last passed it
  survives the next sweep, an unused one goes in position (≈ insertion) order. This holds
  with ``expire_after_access`` too (before, that mode was an exact LRU). An evicted row's
  index entry goes stale (its position is no longer live) and the index ignores it;
- write expiry is a prefix of the positions (rows are appended in time order: the clock is
  monotonic), purged by a binary search; access expiry is one vectorised comparison of the
  access times per call.

One clock reading serves a whole call: a batch's rows share their write/access time.

Threading contract: not thread-safe. A cache belongs to one event loop thread (the mailbox
thread running the lookup function) and every method must be called from that thread.
"""

from __future__ import annotations

import time
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import compress, repeat

import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.lookup._batch_join import Found, match
from spark_jobs.lookup._cache_index import KeyIndex
from spark_jobs.lookup._cache_options import CacheOptions
from spark_jobs.lookup._cache_rows import RowLog, as_float64, as_uint8, take_rows

__all__ = ["Answer", "BatchCache"]

BULK = 64  # an eviction frees maximum_size / BULK rows more than the excess (amortised)
REACH = 1024  # positions ahead of the CLOCK hand whose use is marked, at least
_NO_ROW = pa.scalar(None, pa.int64())


@dataclass(frozen=True, slots=True)
class Answer:
    """The cache's answer for a batch's keys (one per row). ``positions`` (int64): each key's
    position in the log, null for a null key; ``kinds`` (uint8): 1 a cached row, 2 a cached
    miss, 0 not cached, null for a null key; ``absent``: ``kinds == 0`` (None when every key
    was answered) and ``missing`` the distinct keys not cached; ``chunks``/``schema``: the
    log's rows when answered (position ``p`` is row ``p - 1``; they never change)."""

    positions: pa.Array
    kinds: pa.Array
    absent: pa.Array | None
    missing: pa.Array
    chunks: tuple[pa.RecordBatch, ...]
    schema: pa.Schema
    stores: int  # the cache's stores before this answer (see ``BatchCache.store``)

    def rows(
        self, keys: Sequence[pa.Array], found: Found | None
    ) -> tuple[pa.Array, tuple[pa.Array, ...]]:
        """The row of each key (``keys``: the key parts the cache was asked, join-typed),
        null when unmatched, and its looked-up columns: the cached row, else the first row of
        ``found`` (the database's rows for the keys not cached) with that key, else nulls.
        One ``take`` over the cached rows and ``found``'s as one table."""
        rows = pc.if_else(pc.equal(self.kinds, 1), pc.subtract(self.positions, 1), _NO_ROW)
        chunks = self.chunks
        if found is not None and len(found) and self.absent is not None:
            cached = sum(chunk.num_rows for chunk in chunks)
            fetched = pc.add(match(keys, found.keys).cast(pa.int64()), cached)
            rows = pc.if_else(self.absent, fetched, rows)
            chunks = (*chunks, pa.RecordBatch.from_arrays(list(found.values), schema=self.schema))
        return rows, take_rows(self.schema, chunks, rows)


class BatchCache(CacheOptions):
    """Partial cache of rows of ``value_types`` columns, answered per batch (module docstring).

    Keys are one Arrow array per call (``_cache_index.cache_keys`` of the key parts).
    Counters (plain attributes): ``hits``/``misses`` (distinct keys answered / not answered,
    cached misses are hits), ``loads`` (rows stored from the database, cached misses
    included), ``evictions`` (rows removed for size or expiry).
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
        self._index = KeyIndex()
        self._log = self._new_log()
        self._size = 0  # live positions: the entries cached
        self._stores = 0  # calls of store() that stored something
        self._hand = 1  # CLOCK: the position the next sweep starts from
        self._unexpired = 1  # write expiry: the positions below it are expired and purged

    def __len__(self) -> int:
        self._purge(self._clock())
        return self._size

    def _new_log(self) -> RowLog:
        times = {"written"} if self.expire_after_write is not None else set()
        if self.expire_after_access is not None:
            times.add("accessed")
        return RowLog(self._types, frozenset(times))

    def _live(self) -> pa.Array:
        """The live flags by position, as Arrow (a copy)."""
        return as_uint8(self._log.live, 0, self._log.end)

    # -- lookups -------------------------------------------------------------------------

    def lookup(self, keys: pa.Array, distinct: int) -> Answer:
        """Answer ``keys`` (a batch's cache keys, one per row: duplicates and nulls allowed;
        ``distinct`` the number of distinct non-null ones); the rows found are marked used
        (and accessed now). ``hits``/``misses`` count distinct keys."""
        now = self._clock()
        self._purge(now)
        log = self._log
        positions = self._index.probe(keys)
        kinds = self._live().take(positions)  # a stale entry's position is not live: 0
        absent: pa.Array | None = pc.equal(kinds, 0)
        missing = keys.slice(0, 0)
        if pc.any(absent).as_py():
            missing = pc.unique(keys.filter(absent))
        else:
            absent = None
        self.hits += distinct - len(missing)
        self.misses += len(missing)
        self._mark(positions)
        if log.accessed is not None:
            used = positions.drop_null().to_pylist()
            deque(map(log.accessed.__setitem__, used, repeat(now)), maxlen=0)
        return Answer(positions, kinds, absent, missing, log.chunks(), log.schema, self._stores)

    def store(
        self,
        keys: pa.Array,
        found_keys: pa.Array,
        values: Sequence[pa.Array],
        *,
        answer: Answer | None = None,
    ) -> None:
        """Cache the rows the database returned for the distinct ``keys`` (``found_keys``
        aligned with ``values``; the first row of a key found twice is the one kept, as the
        uncached join uses it), and the keys without a row as cached misses; without
        ``cache_missing_key`` those are forgotten instead (the database said they are gone).
        ``answer``: the lookup that found ``keys`` not cached; when nothing was stored since,
        they still are not, and their old entries are not looked for."""
        now = self._clock()
        self._purge(now)
        log, rows = self._log, len(found_keys)
        absent = keys.filter(pc.invert(pc.is_in(keys, value_set=found_keys))) if rows else keys
        if len(absent) and not self.cache_missing_key:
            self._kill(absent)  # forgotten, not evicted: the database has no row
            absent = absent.slice(0, 0)
        count = rows + len(absent)
        if not count:
            return
        self._stores += 1
        # Step 1: a key stored again (another batch stored it meanwhile): its old position
        # becomes garbage.
        stored = pa.concat_arrays([found_keys, absent]) if len(absent) else found_keys
        if answer is None or answer.stores != self._stores - 1:
            self._kill(stored)
        # Step 2: append (cached misses: rows of nulls); ``live``: 1 a row, 2 a cached miss,
        # 0 the later rows of a key found twice.
        live = bytearray(b"\1") * rows + bytearray(b"\2") * len(absent)
        if rows and len(pc.unique(found_keys)) < rows:
            first = pc.index_in(found_keys, value_set=found_keys)  # a key's first row
            live[:rows] = bytes(pc.equal(first, pa.array(range(rows), pa.int32())).to_pylist())
        start = log.append(values, len(absent), bytes(live), now)
        self._size += count - live.count(0)
        # Step 3: index them.
        self._index.add(stored, pa.array(range(start, start + count), pa.int64()), self._live())
        self.loads += count
        self._shrink()

    def clear(self) -> None:
        """Forget every entry (counters are kept)."""
        self._index.clear()
        self._log = self._new_log()
        self._size = 0
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
        near = pc.and_(pc.greater_equal(positions, hand), pc.less(positions, reach))
        if reach > end:
            near = pc.or_(near, pc.less(positions, reach - end + 1))
        deque(map(log.ref.__setitem__, positions.filter(near).to_pylist(), repeat(1)), maxlen=0)

    def _kill(self, keys: pa.Array) -> None:
        """Mark the live entries of ``keys`` garbage (a key may come twice)."""
        positions = self._index.probe(keys)
        dead = set(positions.filter(pc.not_equal(self._live().take(positions), 0)).to_pylist())
        deque(map(self._log.live.__setitem__, dead, repeat(0)), maxlen=0)
        self._size -= len(dead)

    def _shrink(self) -> None:
        """Evict beyond ``maximum_size``; fold the log's tail in, compact its garbage."""
        excess = self._size - self.maximum_size
        if excess > 0:
            self._evict(min(excess + self.maximum_size // BULK, self._size))
        log = self._log
        if log.garbage(self._size):
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
            # Step 1: the candidates: live (1 or 2) and unreferenced (0), as offsets from the
            # hand (live > 2 * ref).
            referenced = pc.multiply(as_uint8(log.ref, hand, stop), 2)
            candidates = pc.indices_nonzero(pc.greater(as_uint8(log.live, hand, stop), referenced))
            offsets = candidates.slice(0, count).to_pylist()
            # Step 2: the hand passes up to the last victim (or the window): second chances.
            last = hand + offsets[-1] if len(offsets) == count else stop - 1
            log.ref[hand : last + 1] = bytes(last + 1 - hand)
            self._hand = last + 1
            # Step 3: the victims leave the index.
            self._remove([hand + offset for offset in offsets])
            count -= len(offsets)

    def _remove(self, positions: list[int]) -> None:
        """Evict the live rows at ``positions`` (size or expiry): their entries go stale."""
        deque(map(self._log.live.__setitem__, positions, repeat(0)), maxlen=0)
        self._size -= len(positions)
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
        live = self._live()
        kept = self._log.compact()
        self._index.renumber(pa.array(kept, pa.int64()), live)
        self._hand = bisect_left(kept, self._hand) + 1
        self._unexpired = bisect_left(kept, self._unexpired) + 1
