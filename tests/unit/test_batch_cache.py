"""BatchCache (the partial cache of BatchLookup, answered per batch) against plain-dict oracles.

1. A Hypothesis state machine runs random lookups and stores (duplicate keys in the rows
   found, cached misses, a virtual clock with write and access expiry, eviction at
   ``maximum_size``) against a deliberately naive model: a dict of every key's last stored
   entry, expired entries found by scanning everything. The cache's CLOCK eviction is not
   modelled: its answers must be the model's, its keys a subset, its size bounded.
2. Random batches (duplicates within a batch, null keys) through BatchLookup's cache path
   (``_cached`` / ``_remember``) and a dict "database": each batch's rows must be exactly
   those of the uncached lookup (the database alone), whatever the cache held.
"""

from __future__ import annotations

import types
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from spark_jobs.lookup._batch_cache import BatchCache
from spark_jobs.lookup._batch_join import Found, distinct_keys, match
from spark_jobs.lookup._batch_lookup import BatchLookup
from spark_jobs.lookup._cache_rows import MIN_GARBAGE, MIN_TAIL, RowLog
from spark_jobs.lookup._hit_rate_guard import HitRateGuard

TYPES = [pa.string(), pa.int64()]
KEYS = st.integers(0, 12)


def row_of(key: int, version: int) -> tuple[str, int]:
    return (f"row {key} v{version}", key * 10 + version)


class Clock:
    def __init__(self) -> None:
        self.now = 0  # integers: expiry compares exactly

    def __call__(self) -> float:
        return float(self.now)


class Model:
    """The cache's semantics, naively: key -> [row or None, written, accessed]. The cache
    evicts like CLOCK (an approximation of LRU the model does not follow): the model keeps
    every key's last stored entry (no size bound), expired by scanning everything, and the
    machine checks that whatever the cache answers is that entry, unexpired, that the cache
    holds no key the model does not, and that it never holds more than ``maximum_size``."""

    def __init__(self, write: int | None, access: int | None, missing: bool) -> None:
        self.write, self.access, self.missing = write, access, missing
        self.entries: dict[int, list[Any]] = {}

    def purge(self, now: int) -> None:
        for key, (_row, written, accessed) in list(self.entries.items()):
            if (self.write is not None and now - written >= self.write) or (
                self.access is not None and now - accessed >= self.access
            ):
                del self.entries[key]

    def store(self, keys: list[int], found: list[tuple[int, Any]], now: int) -> None:
        self.purge(now)
        seen: set[int] = set()
        stored = []
        for key, row in found:
            if key not in seen:  # the first row of a key found twice
                seen.add(key)
                stored.append((key, row))
        for key in keys:
            if key not in seen:
                if self.missing:
                    stored.append((key, None))
                else:
                    self.entries.pop(key, None)
        for key, row in stored:
            self.entries[key] = [row, now, now]


class BatchCacheMachine(RuleBasedStateMachine):
    @initialize(
        size=st.integers(1, 8),
        write=st.none() | st.integers(1, 6),
        access=st.none() | st.integers(1, 6),
        missing=st.booleans(),
        often=st.booleans(),
    )
    def start(
        self, size: int, write: int | None, access: int | None, missing: bool, often: bool
    ) -> None:
        if often:  # compact the log's garbage and merge its tail at (nearly) every store
            RowLog.min_garbage = RowLog.min_tail = 0
        self.clock = Clock()
        self.cache = BatchCache(
            size,
            TYPES,
            expire_after_write=write,
            expire_after_access=access,
            cache_missing_key=missing,
            clock=self.clock,
        )
        self.model = Model(write, access, missing)
        self.version = 0
        self.hits_before = 0

    @rule(keys=st.lists(KEYS, max_size=10, unique=True))
    def lookup(self, keys: list[int]) -> None:
        answer = self.cache.lookup(keys)
        found = {
            keys[i]: (a, b)
            for i, a, b in zip(
                answer.found_at.to_pylist(),
                answer.values[0].to_pylist(),
                answer.values[1].to_pylist(),
                strict=True,
            )
        }
        if answer.missing_at is not None:
            assert [keys[i] for i in answer.missing_at.to_pylist()] == answer.missing
        else:
            assert not answer.missing
        # A key answered is answered with its last stored entry, unexpired (and is accessed
        # now); a key not answered (evicted, expired or never stored) is queried.
        model, now = self.model, self.clock.now
        model.purge(now)
        for key in keys:
            if key in found:
                assert model.entries[key][0] == found[key]
            elif key not in answer.missing:  # a cached miss
                assert key in model.entries and model.entries[key][0] is None
            if key not in answer.missing:
                model.entries[key][2] = now
        assert self.cache.hits - self.hits_before == len(keys) - len(answer.missing)
        self.hits_before = self.cache.hits

    @rule(
        keys=st.lists(KEYS, max_size=10, unique=True),
        present=st.lists(st.booleans(), min_size=10, max_size=10),
        twice=st.booleans(),
    )
    def store(self, keys: list[int], present: list[bool], twice: bool) -> None:
        self.version += 1
        found = [(k, row_of(k, self.version)) for k, p in zip(keys, present, strict=False) if p]
        if twice and found:  # a key found twice (a table without a unique key): first wins
            found.append((found[0][0], row_of(found[0][0], self.version + 100)))
        self.cache.store(
            keys,
            [k for k, _ in found],
            [pa.array([r[i] for _, r in found], t) for i, t in enumerate(TYPES)],
        )
        self.model.store(keys, found, self.clock.now)

    @rule(seconds=st.integers(0, 4))
    def advance(self, seconds: int) -> None:
        self.clock.now += seconds

    @precondition(lambda self: self.version % 7 == 3)
    @rule()
    def clear(self) -> None:
        self.cache.clear()
        self.model.entries.clear()

    @invariant()
    def bounded_and_consistent(self) -> None:
        self.model.purge(self.clock.now)
        cache = self.cache
        assert len(cache) <= min(len(self.model.entries), cache.maximum_size)
        # Every cached key is the model's: a row (position > 0) or a cached miss (< 0).
        log = cache._log
        for key, position in cache._index.items():
            assert (position > 0) == (self.model.entries[key][0] is not None)
            assert log.keys[abs(position)] == key and log.live[abs(position)] == 1
        assert sum(log.live) == len(cache._index)
        # The log holds the live rows and bounded garbage.
        assert log.end - 1 <= 2 * max(len(cache._index), 4096) + 10

    def teardown(self) -> None:
        RowLog.min_garbage, RowLog.min_tail = MIN_GARBAGE, MIN_TAIL


TestBatchCacheMachine = BatchCacheMachine.TestCase
TestBatchCacheMachine.settings = settings(max_examples=80, stateful_step_count=30, deadline=None)


def test_eviction_spares_the_recently_used_and_is_counted() -> None:
    cache = BatchCache(2, TYPES, expire_after_access=60)
    cache.store([1, 2], [1, 2], [pa.array(["a", "b"]), pa.array([1, 2])])
    assert cache.lookup([1]).found_at.to_pylist() == [0]  # 1 is now used, 2 is not
    cache.store([3], [3], [pa.array(["c"]), pa.array([3])])
    answer = cache.lookup([1, 2, 3])
    found = dict(zip(answer.found_at.to_pylist(), answer.values[0].to_pylist(), strict=True))
    assert answer.missing == [2] and found == {0: "a", 2: "c"}
    assert (cache.hits, cache.misses, cache.loads, cache.evictions) == (3, 1, 3, 1)


def test_without_access_expiry_a_used_key_gets_a_second_chance() -> None:
    cache = BatchCache(2, TYPES)  # CLOCK
    cache.store([1, 2], [1, 2], [pa.array(["a", "b"]), pa.array([1, 2])])
    cache.lookup([1])  # marks 1: at the head, it is kept and 2 is evicted
    cache.store([3], [3], [pa.array(["c"]), pa.array([3])])
    assert cache.lookup([1, 2, 3]).missing == [2]
    # 3 and 1 are marked: both get their second chance, so the unused 4 is evicted.
    cache.store([4], [4], [pa.array(["d"]), pa.array([4])])
    assert sorted(cache._index) == [1, 3] and cache.evictions == 2


def test_the_log_takes_rows_of_base_and_tail_in_the_positions_order() -> None:
    """One take over the base and the tail's batches: the rows come in the order asked."""
    log = RowLog(TYPES, frozenset())
    for keys in ([0, 1, 2], [3, 4], [5]):
        rows = [row_of(key, 0) for key in keys]
        columns = [pa.array([r[i] for r in rows], t) for i, t in enumerate(TYPES)]
        log.append(keys, columns, b"\1" * len(keys), 0.0)
        if keys == [0, 1, 2]:
            log.merge()  # the base; the next two batches stay in the tail
    positions = [6, 1, 4, 3, 6, 2, 5]  # row of key k at position k + 1
    names, numbers = log.take(pa.array(positions, pa.int64()))
    assert list(zip(names.to_pylist(), numbers.to_pylist(), strict=True)) == [
        row_of(p - 1, 0) for p in positions
    ]
    log.merge()
    assert log.take(pa.array([3, 1], pa.int64()))[0].to_pylist() == ["row 2 v0", "row 0 v0"]


def test_many_batches_compact_the_log_and_keep_every_row() -> None:
    cache = BatchCache(5_000, TYPES)
    for batch in range(40):
        keys = list(range(batch * 100, batch * 100 + 3_000))
        answer = cache.lookup(keys)
        cached = dict(
            zip(
                [keys[i] for i in answer.found_at.to_pylist()],
                answer.values[1].to_pylist(),
                strict=True,
            )
        )
        assert all(value == key for key, value in cached.items())
        cache.store(
            answer.missing,
            answer.missing,
            [pa.array([str(k) for k in answer.missing]), pa.array(answer.missing)],
        )
        assert len(cache) <= 5_000
        assert cache._log.end - 1 <= 2 * max(len(cache), 4096) + 3_000
    assert cache.evictions > 0


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


# -- through BatchLookup's cache path: identical to the uncached lookup -------------------


DATABASE = {k: (f"user {k}", k * 7) for k in range(0, 40) if k % 5 != 0}  # 0, 5, ..: no row


def fetch(missing: list[pa.Array]) -> Found:
    """The database's answer for distinct keys: their rows (absent keys have none)."""
    keys = [k for k in missing[0].to_pylist() if k in DATABASE]
    return Found(
        (pa.array(keys, pa.int64()),),
        (
            pa.array([DATABASE[k][0] for k in keys], pa.string()),
            pa.array([DATABASE[k][1] for k in keys], pa.int64()),
        ),
    )


def lookup_path(size: int, min_hit_rate: float, clock: Clock) -> Any:
    self = types.SimpleNamespace()
    self._cache = BatchCache(size, TYPES, expire_after_write=5, clock=clock)
    self._guard = HitRateGuard(min_hit_rate, window=20, pause=1)
    self._nothing = Found((pa.array([], pa.int64()),), tuple(pa.array([], t) for t in TYPES))
    self.cache_hits = self.cache_misses = self.cache_bypassed = 0
    return self


@settings(max_examples=60, deadline=None)
@given(
    size=st.integers(1, 30),
    min_hit_rate=st.sampled_from([0.0, 0.5, 1.0]),
    batches=st.lists(
        st.tuples(st.lists(st.none() | st.integers(0, 45), max_size=25), st.integers(0, 3)),
        max_size=25,
    ),
)
def test_cached_batches_equal_the_uncached_lookup(
    size: int, min_hit_rate: float, batches: list[tuple[list[int | None], int]]
) -> None:
    clock = Clock()
    path = lookup_path(size, min_hit_rate, clock)
    for values, seconds in batches:
        clock.now += seconds
        keys = [pa.array(values, pa.int64())]
        distinct = distinct_keys(keys)
        hits, missing, missing_keys = BatchLookup._cached(path, distinct)  # type: ignore[arg-type]
        found = hits
        if missing is not None:
            fetched = fetch(missing)
            if missing_keys is not None:
                BatchLookup._remember(path, missing_keys, fetched)  # type: ignore[arg-type]
            found = Found.concat([fetched, hits])
        positions = match(keys, found.keys).to_pylist()
        got = [
            None if p is None else (found.values[0][p].as_py(), found.values[1][p].as_py())
            for p in positions
        ]
        # The oracle, computed independently: the database alone.
        assert got == [None if v is None else DATABASE.get(v) for v in values]
        # Each distinct key of the batch was found once: no duplicate rows in the answer.
        assert len(found.keys[0]) == len(set(found.keys[0].to_pylist()))
    asked = path.cache_hits + path.cache_misses + path.cache_bypassed
    assert asked == sum(len({v for v in values if v is not None}) for values, _ in batches)
