"""BatchCache (the partial cache of BatchLookup, answered per batch) against plain-dict oracles.

1. A Hypothesis state machine runs random lookups and stores (duplicate keys in the rows
   found, cached misses, a virtual clock with write and access expiry, eviction at
   ``maximum_size``) against a deliberately naive model: an OrderedDict in recency order,
   expired entries found by scanning everything.
2. Random batches (duplicates within a batch, null keys) through BatchLookup's cache path
   (``_cached`` / ``_remember``) and a dict "database": each batch's rows must be exactly
   those of the uncached lookup (the database alone), whatever the cache held.
"""

from __future__ import annotations

import types
from collections import OrderedDict
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from spark_jobs.lookup._batch_cache import BatchCache
from spark_jobs.lookup._batch_join import Found, distinct_keys, match
from spark_jobs.lookup._batch_lookup import BatchLookup
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
    """The cache's semantics, naively: key -> [row or None, written, accessed], least recent
    first. With ``access`` expiry an exact LRU (a hit moves its key to the end, eviction at
    the head). Without, the cache evicts like CLOCK with a bounded sweep, a heuristic the
    model does not follow: it keeps every key's last stored entry (``size`` unbounded) and
    the machine checks that whatever the cache answers is that entry, unexpired."""

    def __init__(self, size: int, write: int | None, access: int | None, missing: bool) -> None:
        self.size, self.write, self.access, self.missing = size, write, access, missing
        self.entries: OrderedDict[int, list[Any]] = OrderedDict()
        self.exact = access is not None

    def purge(self, now: int) -> None:
        for key, (_row, written, accessed) in list(self.entries.items()):
            if (self.write is not None and now - written >= self.write) or (
                self.access is not None and now - accessed >= self.access
            ):
                del self.entries[key]

    def lookup(self, keys: list[int], now: int) -> tuple[dict[int, Any], set[int]]:
        self.purge(now)
        hits = {k: self.entries[k][0] for k in keys if k in self.entries}
        for key in [k for k in self.entries if k in hits and self.exact]:
            self.entries[key][2] = now  # (their recency order kept)
            self.entries.move_to_end(key)
        return {k: r for k, r in hits.items() if r is not None}, set(keys) - set(hits)

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
            self.entries.pop(key, None)
            self.entries[key] = [row, now, now]
        while self.exact and len(self.entries) > self.size:
            self.entries.popitem(last=False)


class BatchCacheMachine(RuleBasedStateMachine):
    @initialize(
        size=st.integers(1, 8),
        write=st.none() | st.integers(1, 6),
        access=st.none() | st.integers(1, 6),
        missing=st.booleans(),
    )
    def start(self, size: int, write: int | None, access: int | None, missing: bool) -> None:
        self.clock = Clock()
        self.cache = BatchCache(
            size,
            TYPES,
            expire_after_write=write,
            expire_after_access=access,
            cache_missing_key=missing,
            clock=self.clock,
        )
        self.model = Model(size, write, access, missing)
        self.version = 0

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
        model = self.model
        if model.exact:
            expected, missing = model.lookup(keys, self.clock.now)
            assert found == expected
            assert set(answer.missing) == missing and len(answer.missing) == len(missing)
            return
        # CLOCK: a key answered is answered with its last stored entry, unexpired; a key
        # not answered (evicted or never stored) is queried.
        model.purge(self.clock.now)
        for key in keys:
            if key in found:
                assert model.entries[key][0] == found[key]
            elif key not in answer.missing:  # a cached miss
                assert key in model.entries and model.entries[key][0] is None

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
    def same_size(self) -> None:
        self.model.purge(self.clock.now)
        if self.model.exact:
            assert len(self.cache) == len(self.model.entries) <= self.cache.maximum_size
        else:
            assert len(self.cache) <= min(len(self.model.entries), self.cache.maximum_size)
        # The log holds the live rows and bounded garbage.
        cache = self.cache
        assert cache._end - cache._head <= 2 * max(len(cache._index), 4096) + 10


TestBatchCacheMachine = BatchCacheMachine.TestCase
TestBatchCacheMachine.settings = settings(max_examples=80, stateful_step_count=30, deadline=None)


def test_eviction_is_least_recently_used_and_counted() -> None:
    cache = BatchCache(2, TYPES, expire_after_access=60)  # exact LRU
    cache.store([1, 2], [1, 2], [pa.array(["a", "b"]), pa.array([1, 2])])
    assert cache.lookup([1]).found_at.to_pylist() == [0]  # 1 is now more recent than 2
    cache.store([3], [3], [pa.array(["c"]), pa.array([3])])
    answer = cache.lookup([1, 2, 3])
    assert answer.missing == [2] and answer.values[0].to_pylist() == ["a", "c"]
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
        assert cache._end - cache._head <= 2 * max(len(cache), 4096) + 3_000
    assert cache.evictions > 0 and len(cache._chunks) <= 20


def test_the_guard_bypasses_a_warm_cache_below_its_threshold_and_samples_it_again() -> None:
    cache = BatchCache(10, TYPES)
    guard = HitRateGuard(0.5, window=100, pause=2)
    assert guard.consult(100)
    guard.record(0, 100, cache)  # a window that started cold is not judged
    assert guard.consult(100)
    cache.loads = 10  # warm
    guard.record(0, 100, cache)  # (that window started cold too)
    assert guard.consult(100)
    guard.record(10, 100, cache)  # 10 % hits: below 50 %
    assert [guard.consult(100), guard.consult(100), guard.consult(100)] == [False, False, True]
    assert guard.bypassed == 200
    guard.record(90, 100, cache)  # 90 %: consulted again
    assert guard.consult(100) and guard.consult(100)
    with pytest.raises(ValueError, match="threshold"):
        HitRateGuard(1.5)


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
