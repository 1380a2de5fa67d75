"""``BatchCache``: the partial lookup cache of :class:`~spark_jobs.lookup.BatchLookup`, per batch.

The semantics of :class:`~spark_jobs.lookup.LookupCache` (Flink's ``DefaultLookupCache``:
at most ``maximum_size`` rows, ``expire_after_write``/``expire_after_access``, cached misses),
but the rows are held in Arrow and a batch's keys are answered in one pass, so that a cache
costs little per key (the per-row cache made the clickstream run at 0.75x at 9 % hits):

- a dict maps each cached key to its position in an append-only *log* of Arrow chunks (the
  looked-up columns, a ``present`` flag: False = a cached miss, and the write/access times
  when a TTL needs them). A lookup is one ``dict.get`` per key, then one ``take`` per chunk
  and column for the hits; no Python object is built per row or value;
- eviction (size, access expiry) advances the *head* of the log. Without
  ``expire_after_access`` eviction is CLOCK: a hit only marks its key (a set), and a marked
  live row reaching the head is appended again, unmarked, instead of being evicted (a
  "second chance"), within a bounded sweep (the oldest rows beyond it go, used or not).
  With ``expire_after_access`` it is an exact LRU: every hit is appended
  again with its access time, so the log is in access order and its head expires first;
- rows superseded by a later append are garbage, skipped at the head and compacted away once
  they outnumber the live rows (amortised per appended row);
- chunks are merged like a counter in base 4 (a chunk is merged with the previous one while
  that one is at most 4x larger), so a lookup visits O(log rows) chunks, few in practice, and
  each row is copied O(log rows) times.

One clock reading serves a whole call: a batch's rows share their write/access time. The hits
of one lookup keep their recency order among themselves (they are re-appended in log order);
a store appends the rows found in their order, then the keys without a row in the keys'
order.

Threading contract: not thread-safe. A cache belongs to one event loop thread (the mailbox
thread running the lookup function) and every method must be called from that thread.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate, compress, repeat
from operator import and_, eq, is_, is_not, xor
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["Answer", "BatchCache"]

MIN_GARBAGE = 4096  # rows of garbage always tolerated before a compaction


@dataclass(slots=True)
class _Chunk:
    """Log rows ``[start, start + len(keys))``: their cache keys and columns."""

    start: int
    keys: list[Any]
    values: tuple[pa.Array, ...]
    present: pa.Array  # bool: False = a cached miss (values null)
    written: pa.Array | None  # float64 write times (with expire_after_write)
    accessed: pa.Array | None  # float64 access times (with expire_after_access)
    oldest_write: float  # min(written) of rows not purged yet (inf without written)

    @property
    def end(self) -> int:
        return self.start + len(self.keys)


@dataclass(frozen=True, slots=True)
class Answer:
    """The cache's answer for a batch's distinct keys: ``found_at`` (int64 indices into the
    keys) of the keys cached with a row, ``values`` their rows (aligned with ``found_at``);
    ``missing_at`` the indices of keys the cache does not hold (None: none), ``missing``
    those keys."""

    found_at: pa.Array
    values: tuple[pa.Array, ...]
    missing_at: pa.Array | None
    missing: list[Any]


class BatchCache:
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
        self._types = tuple(value_types)
        self._clock = clock
        self._index: dict[Any, int] = {}  # key -> its live row's log position
        # CLOCK: keys used since their row was last at the head (None: exact LRU).
        self._referenced: set[Any] | None = None if expire_after_access is not None else set()
        self._chunks: list[_Chunk] = []  # in log order
        self._head = 0  # log position of the first row not dropped
        self._end = 0  # log position after the last row
        self.hits = 0
        self.misses = 0
        self.loads = 0
        self.evictions = 0

    def __len__(self) -> int:
        self._purge(self._clock())
        return len(self._index)

    # -- lookups -------------------------------------------------------------------------

    def lookup(self, keys: list[Any]) -> Answer:
        """Answer the distinct ``keys`` (cache keys: a value, or a tuple of a composite key);
        the rows found become the most recently used."""
        now = self._clock()
        self._purge(now)
        where = list(map(self._index.get, keys))
        positions = pa.array(where, pa.int64())
        hit = positions.is_valid()
        hit_at = pc.indices_nonzero(hit)
        found = len(hit_at)
        self.hits += found
        self.misses += len(keys) - found
        missing_at = None if found == len(keys) else pc.indices_nonzero(pc.invert(hit))
        missing = [] if missing_at is None else list(compress(keys, map(is_, where, repeat(None))))
        if not found:
            empty = pa.array([], pa.int64())
            return Answer(empty, tuple(pa.array([], t) for t in self._types), missing_at, missing)
        # Step 1: the hits' rows, chunk by chunk, in log order.
        order = pc.sort_indices(positions.filter(hit))
        at = hit_at.take(order)
        rows = self._take(positions.filter(hit).take(order), self._referenced is None)
        # Step 2: they become recently used: appended again (exact LRU, written kept), or
        # marked for a second chance at the head (CLOCK).
        if self._referenced is None:
            hit_keys = [keys[i] for i in at.to_pylist()]
            self._append(hit_keys, rows.values, rows.present, rows.written, now)
            self._shrink()
        else:
            self._referenced.update(compress(keys, map(is_not, where, repeat(None))))
        # Step 3: cached misses answer "no row": not part of the rows found.
        if not pc.all(rows.present).as_py():
            at = at.filter(rows.present)
            return Answer(
                at, tuple(v.filter(rows.present) for v in rows.values), missing_at, missing
            )
        return Answer(at, rows.values, missing_at, missing)

    def store(self, keys: list[Any], found_keys: list[Any], values: Sequence[pa.Array]) -> None:
        """Cache the rows the database returned for ``keys`` (``found_keys`` aligned with
        ``values``), and the keys without a row as cached misses; without
        ``cache_missing_key`` those are forgotten instead (the database said they are gone)."""
        now = self._clock()
        self._purge(now)
        known = set(found_keys)
        absent = [k for k in keys if k not in known]  # in the keys' order: LRU order
        columns = tuple(values)
        present = pa.nulls(len(found_keys), pa.bool_()).fill_null(True)
        stored = list(found_keys)
        if absent and self.cache_missing_key:
            stored += absent
            columns = tuple(
                pa.concat_arrays([v, pa.nulls(len(absent), t)])
                for v, t in zip(columns, self._types, strict=True)
            )
            present = pa.concat_arrays(
                [present, pa.nulls(len(absent), pa.bool_()).fill_null(False)]
            )
        elif absent:
            for key in absent:
                self._index.pop(key, None)
        if stored:
            if self._referenced is not None:
                self._referenced.difference_update(stored)  # a new row: not used yet
            self._append(stored, columns, present, None, now)
            self.loads += len(stored)
            self._shrink()

    def clear(self) -> None:
        """Forget every entry (counters are kept)."""
        self._index.clear()
        if self._referenced is not None:
            self._referenced.clear()
        self._chunks.clear()
        self._head = self._end

    # -- the log -------------------------------------------------------------------------

    def _take(self, positions: pa.Array, written: bool) -> _Chunk:
        """The rows at sorted log ``positions`` (their keys are not filled in; their write
        times only if ``written``: re-appended rows keep them)."""
        where = positions.to_pylist()
        parts: list[_Chunk] = []
        for chunk in self._chunks:
            lo, hi = bisect_left(where, chunk.start), bisect_left(where, chunk.end)
            if lo == hi:
                continue
            taken = pc.subtract(positions.slice(lo, hi - lo), chunk.start)
            parts.append(
                _Chunk(
                    0,
                    [],
                    tuple(v.take(taken) for v in chunk.values),
                    chunk.present.take(taken),
                    None if chunk.written is None or not written else chunk.written.take(taken),
                    None,
                    0.0,
                )
            )
        return _concat(parts, self._types)

    def _append(
        self,
        keys: list[Any],
        values: tuple[pa.Array, ...],
        present: pa.Array,
        written: pa.Array | None,
        now: float,
    ) -> None:
        """Append rows (most recently used last); the first of duplicate keys is the live one,
        as the uncached join uses the first row of a key found twice."""
        start, count = self._end, len(keys)
        if self.expire_after_write is not None and written is None:
            written = pa.nulls(count, pa.float64()).fill_null(now)
        accessed = None
        if self.expire_after_access is not None:
            accessed = pa.nulls(count, pa.float64()).fill_null(now)
        oldest = pc.min(written).as_py() if written is not None and count else float("inf")
        self._chunks.append(_Chunk(start, keys, values, present, written, accessed, oldest))
        self._end += count
        self._index.update(
            zip(reversed(keys), range(start + count - 1, start - 1, -1), strict=True)
        )
        # A counter in base 4: merge while the previous chunk is at most 4x the last one (few
        # chunks to take from, each row copied O(log rows) times).
        chunks = self._chunks
        while len(chunks) > 1 and len(chunks[-2].keys) <= 4 * len(chunks[-1].keys):
            last = chunks.pop()
            chunks[-1] = _concat([chunks[-1], last], self._types, chunks[-1].start)

    def _shrink(self) -> None:
        """Evict the least recently used rows beyond ``maximum_size``; compact the garbage."""
        excess = len(self._index) - self.maximum_size
        if excess > 0:
            self._drop_head(lambda chunk, offset: len(chunk.keys) - offset, excess, True)
        garbage = (self._end - self._head) - len(self._index)
        if garbage > max(len(self._index), MIN_GARBAGE):
            self._compact()

    def _drop_head(
        self, limit: Callable[[_Chunk, int], int], live: int | None, second_chance: bool = False
    ) -> None:
        """Drop rows from the head: at most ``limit(chunk, offset)`` rows of each chunk, and
        stop after ``live`` live rows (None: no bound). The liveness test and the deletes run
        in C loops (``map``) over slices: a head row costs tens of nanoseconds."""
        index, referenced = self._index, self._referenced if second_chance else None
        # The hand's sweep is bounded: second chances only within the first slice of
        # `live + live / 4 + 64` rows; beyond it, the oldest rows go whether used or not. (When
        # most keys are used, e.g. ~90 % hits over uniform keys, an unbounded sweep re-appended
        # most of the log per batch and cost more than the queries it saved.)
        window = 0 if live is None else live + live // 4 + 64
        while self._chunks and (live is None or live > 0):
            chunk = self._chunks[0]
            offset = self._head - chunk.start
            count = limit(chunk, offset)
            if count <= 0:
                return
            # Step 1: a slice of the head: at most `live` rows, more with second chances.
            if live is not None:
                count = min(count, live if not referenced else window)
            keys = chunk.keys[offset : offset + count]
            count = len(keys)
            alive = list(map(eq, map(index.get, keys), range(self._head, self._head + count)))
            used: list[bool] = []
            if referenced:
                # CLOCK: live rows used since they were last here get a second chance.
                used = list(map(and_, alive, map(referenced.__contains__, keys)))
                alive = list(map(xor, alive, used))  # now: the rows to evict
            # Step 2: cut the slice after the `live`-th row to evict.
            if live is not None:
                evicted = list(accumulate(alive))
                if evicted and evicted[-1] >= live:
                    count = bisect_left(evicted, live) + 1
                    keys, alive, used = keys[:count], alive[:count], used[:count]
            self._head += count
            if referenced and any(used):
                self._second_chance(chunk, offset, keys, used)
            referenced = None  # (the sweep's bound)
            # Step 3: forget the evicted keys (garbage rows were superseded already).
            dead = list(compress(keys, alive))
            deque(map(index.__delitem__, dead), maxlen=0)
            if self._referenced is not None:
                self._referenced.difference_update(dead)
            self.evictions += len(dead)
            if live is not None:
                live -= len(dead)
            if self._head >= self._chunks[0].end:  # (a second chance may have merged it)
                self._chunks.pop(0)

    def _second_chance(self, chunk: _Chunk, offset: int, keys: list[Any], used: list[bool]) -> None:
        """Append the ``used`` rows of ``keys`` (``chunk``'s rows from ``offset``) again,
        unmarked (their write times kept)."""
        assert self._referenced is not None
        again = list(compress(keys, used))
        self._referenced.difference_update(again)
        at = pc.add(pc.indices_nonzero(pa.array(used, pa.bool_())), offset)
        self._append(
            again,
            tuple(v.take(at) for v in chunk.values),
            chunk.present.take(at),
            None if chunk.written is None else chunk.written.take(at),
            0.0,  # (no access times in CLOCK mode)
        )

    def _purge(self, now: float) -> None:
        """Remove the expired rows: by access at the head (the log is in access order), by
        write in any chunk whose oldest write is expired."""
        ttl = self.expire_after_access
        if ttl is not None:
            cutoff = now - ttl

            def expired(chunk: _Chunk, offset: int) -> int:
                assert chunk.accessed is not None  # sorted: the expired rows are a prefix
                return int(pc.sum(pc.less_equal(chunk.accessed.slice(offset), cutoff)).as_py() or 0)

            self._drop_head(expired, None)
        ttl = self.expire_after_write
        if ttl is None:
            return
        cutoff, index = now - ttl, self._index
        for chunk in self._chunks:
            if chunk.oldest_write > cutoff:
                continue
            assert chunk.written is not None
            old = pc.less_equal(chunk.written, cutoff)
            for offset in pc.indices_nonzero(old).to_pylist():
                key = chunk.keys[offset]
                if index.get(key) == chunk.start + offset:
                    del index[key]
                    if self._referenced is not None:
                        self._referenced.discard(key)
                    self.evictions += 1
            rest = chunk.written.filter(pc.invert(old))
            chunk.oldest_write = pc.min(rest).as_py() if len(rest) else float("inf")

    def _compact(self) -> None:
        """Rewrite the live rows as one chunk at the end of the log (in the same order)."""
        index, head = self._index, self._head
        parts = []
        for chunk in self._chunks:
            offset = max(head - chunk.start, 0)
            keys = chunk.keys[offset:]
            live = list(map(eq, map(index.get, keys), range(chunk.start + offset, chunk.end)))
            mask = pa.array(live, pa.bool_())
            parts.append(
                _Chunk(
                    0,
                    list(compress(keys, live)),
                    tuple(v.slice(offset).filter(mask) for v in chunk.values),
                    chunk.present.slice(offset).filter(mask),
                    None if chunk.written is None else chunk.written.slice(offset).filter(mask),
                    None if chunk.accessed is None else chunk.accessed.slice(offset).filter(mask),
                    chunk.oldest_write,
                )
            )
        merged = _concat(parts, self._types, self._end)
        self._chunks = [merged] if merged.keys else []
        self._head = self._end
        self._end += len(merged.keys)
        index.update(zip(merged.keys, range(merged.start, merged.end), strict=True))


def _concat(parts: list[_Chunk], types: tuple[pa.DataType, ...], start: int = 0) -> _Chunk:
    """The rows of ``parts`` in order as one chunk at log position ``start``."""
    if len(parts) == 1:
        only = parts[0]
        return _Chunk(
            start,
            only.keys,
            only.values,
            only.present,
            only.written,
            only.accessed,
            only.oldest_write,
        )
    if not parts:
        empty = pa.array([], pa.float64())
        return _Chunk(
            start,
            [],
            tuple(pa.array([], t) for t in types),
            pa.array([], pa.bool_()),
            empty,
            empty,
            float("inf"),
        )
    keys: list[Any] = []
    for part in parts:
        keys += part.keys
    first = parts[0]
    return _Chunk(
        start,
        keys,
        tuple(pa.concat_arrays([p.values[i] for p in parts]) for i in range(len(types))),
        pa.concat_arrays([p.present for p in parts]),
        None if first.written is None else pa.concat_arrays([p.written for p in parts]),
        None if first.accessed is None else pa.concat_arrays([p.accessed for p in parts]),
        min(p.oldest_write for p in parts),
    )
