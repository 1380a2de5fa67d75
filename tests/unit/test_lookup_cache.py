"""LookupCache: LRU size bound, write/access expiry on a fake clock, cached misses, counters.

A Hypothesis state machine checks every operation against a deliberately naive model (a dict
plus an LRU list, expired entries found by scanning everything).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from spark_jobs.lookup import CacheHit, LookupCache
from spark_jobs.lookup._batch_cache import BatchCache


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def rows(cache: LookupCache[str, str], *keys: str) -> list[str | None]:
    """The cached row of each key ("-" for no entry)."""
    out: list[str | None] = []
    for key in keys:
        hit = cache.get(key)
        out.append("-" if hit is None else hit.row)
    return out


def test_lru_evicts_the_least_recently_used_entry() -> None:
    cache: LookupCache[str, str] = LookupCache(2)
    cache.put("a", "A")
    cache.put("b", "B")
    assert rows(cache, "a") == ["A"]  # "a" is now more recent than "b"
    cache.put("c", "C")
    assert len(cache) == 2
    assert rows(cache, "a", "b", "c") == ["A", "-", "C"]
    assert cache.evictions == 1


def test_put_of_a_present_key_replaces_it_without_eviction() -> None:
    cache: LookupCache[str, str] = LookupCache(2)
    cache.put("a", "A")
    cache.put("b", "B")
    cache.put("a", "A2")  # refreshes "a": "b" is now the LRU entry
    assert cache.evictions == 0
    cache.put("c", "C")
    assert rows(cache, "a", "b", "c") == ["A2", "-", "C"]


def test_expire_after_write_ignores_reads() -> None:
    clock = FakeClock()
    cache: LookupCache[str, str] = LookupCache(10, expire_after_write=10, clock=clock)
    cache.put("a", "A")
    clock.advance(9.5)
    assert rows(cache, "a") == ["A"]  # reading does not extend a write expiry
    clock.advance(0.5)
    assert rows(cache, "a") == ["-"]
    assert len(cache) == 0
    assert cache.evictions == 1  # expiry counts as eviction (as in Guava)


def test_expire_after_access_is_extended_by_reads() -> None:
    clock = FakeClock()
    cache: LookupCache[str, str] = LookupCache(10, expire_after_access=10, clock=clock)
    cache.put("a", "A")
    for _ in range(5):
        clock.advance(9)
        assert rows(cache, "a") == ["A"]
    clock.advance(10)
    assert rows(cache, "a") == ["-"]


def test_both_expiries_apply_whichever_comes_first() -> None:
    clock = FakeClock()
    cache: LookupCache[str, str] = LookupCache(
        10, expire_after_write=30, expire_after_access=10, clock=clock
    )
    cache.put("idle", "I")
    cache.put("busy", "B")
    for _ in range(3):
        clock.advance(9)
        assert rows(cache, "busy") == ["B"]
    assert len(cache) == 1  # "idle" expired by access at t=10
    clock.advance(3)  # t=30: "busy" expires by write although it was just read
    assert rows(cache, "busy") == ["-"]


def test_missing_keys_are_cached_by_default() -> None:
    cache: LookupCache[str, str] = LookupCache(10)
    cache.put("ghost", None)
    hit = cache.get("ghost")
    assert isinstance(hit, CacheHit)
    assert hit.row is None
    assert (cache.hits, cache.misses, cache.loads) == (1, 0, 1)


def test_without_cache_missing_key_a_miss_is_not_cached_and_drops_a_stale_row() -> None:
    cache: LookupCache[str, str] = LookupCache(10, cache_missing_key=False)
    cache.put("ghost", None)
    assert cache.get("ghost") is None
    cache.put("gone", "row")
    cache.put("gone", None)  # the database says the row no longer exists
    assert cache.get("gone") is None
    assert len(cache) == 0


def test_counters() -> None:
    cache: LookupCache[str, str] = LookupCache(1)
    assert cache.get("a") is None
    cache.put("a", "A")
    cache.get("a")
    cache.get("a")
    cache.put("b", "B")
    cache.invalidate("b")
    cache.invalidate("never")
    assert (cache.hits, cache.misses, cache.loads, cache.evictions) == (2, 1, 2, 1)
    assert len(cache) == 0


def test_a_hit_is_the_same_object_every_time() -> None:
    cache: LookupCache[str, str] = LookupCache(1)
    cache.put("a", "A")
    assert cache.get("a") is cache.get("a")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"maximum_size": 0}, "maximum_size"),
        ({"maximum_size": 1, "expire_after_write": -1}, "expire_after_write"),
        ({"maximum_size": 1, "expire_after_access": -1}, "expire_after_access"),
    ],
)
def test_invalid_settings_are_rejected(kwargs: dict[str, Any], message: str) -> None:
    # Both partial caches check their options in one place (CacheOptions).
    with pytest.raises(ValueError, match=message):
        LookupCache(**kwargs)
    with pytest.raises(ValueError, match=message):
        BatchCache(value_types=[pa.int64()], **kwargs)


class Model:
    """The naive reference: scan everything for expiry, an LRU list of keys."""

    def __init__(self, size: int, write: float | None, access: float | None, missing: bool) -> None:
        self.size, self.write, self.access, self.missing = size, write, access, missing
        self.entries: dict[int, tuple[str | None, float, float]] = {}
        self.lru: list[int] = []
        self.hits = self.misses = self.loads = self.evictions = 0

    def purge(self, now: float) -> None:
        for key, (_, written, accessed) in list(self.entries.items()):
            if (self.write is not None and now - written >= self.write) or (
                self.access is not None and now - accessed >= self.access
            ):
                del self.entries[key]
                self.lru.remove(key)
                self.evictions += 1

    def get(self, key: int, now: float) -> tuple[str | None] | None:
        self.purge(now)
        if key not in self.entries:
            self.misses += 1
            return None
        row, written, _ = self.entries[key]
        self.entries[key] = (row, written, now)
        self.lru.remove(key)
        self.lru.append(key)
        self.hits += 1
        return (row,)

    def put(self, key: int, row: str | None, now: float) -> None:
        if row is None and not self.missing:
            self.invalidate(key)
            return
        self.purge(now)
        if key in self.entries:
            self.lru.remove(key)
        elif len(self.entries) >= self.size:
            del self.entries[self.lru.pop(0)]
            self.evictions += 1
        self.entries[key] = (row, now, now)
        self.lru.append(key)
        self.loads += 1

    def invalidate(self, key: int) -> None:
        if self.entries.pop(key, None) is not None:
            self.lru.remove(key)


keys = st.integers(0, 7)
ttls = st.none() | st.integers(0, 6).map(float)


class CacheMachine(RuleBasedStateMachine):
    cache: LookupCache[int, str]
    model: Model
    clock: FakeClock

    @initialize(size=st.integers(1, 5), write=ttls, access=ttls, missing=st.booleans())
    def setup(self, size: int, write: float | None, access: float | None, missing: bool) -> None:
        self.clock = FakeClock()
        self.cache = LookupCache(
            size,
            expire_after_write=write,
            expire_after_access=access,
            cache_missing_key=missing,
            clock=self.clock,
        )
        self.model = Model(size, write, access, missing)

    @rule(key=keys)
    def get(self, key: int) -> None:
        hit = self.cache.get(key)
        expected = self.model.get(key, self.clock.now)
        assert (None if hit is None else (hit.row,)) == expected

    @rule(key=keys, row=st.none() | st.sampled_from(["x", "y"]))
    def put(self, key: int, row: str | None) -> None:
        self.cache.put(key, row)
        self.model.put(key, row, self.clock.now)

    @rule(key=keys)
    def invalidate(self, key: int) -> None:
        self.cache.invalidate(key)
        self.model.invalidate(key)

    @rule(seconds=st.sampled_from([0.5, 1.0, 3.0]))
    def tick(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @invariant()
    def same_counters(self) -> None:
        if not hasattr(self, "cache"):
            return
        # len() purges, as every model operation does: compare after it.
        self.model.purge(self.clock.now)
        assert len(self.cache) == len(self.model.entries)
        cache, model = self.cache, self.model
        assert (cache.hits, cache.misses, cache.loads, cache.evictions) == (
            model.hits,
            model.misses,
            model.loads,
            model.evictions,
        )


CacheMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
TestCacheAgainstModel = CacheMachine.TestCase


@st.composite
def _batches(draw: st.DrawFn) -> list[tuple[str, float, list[tuple[str, str | None]]]]:
    ops = st.lists(st.tuples(st.sampled_from("abcdefg"), st.sampled_from(["x", "y", None])))
    kind = st.sampled_from(["get", "put"])
    return draw(st.lists(st.tuples(kind, st.sampled_from([0.0, 0.4, 1.1]), ops), max_size=12))


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"expire_after_write": 1.0},
        {"expire_after_access": 1.0},
        {"expire_after_write": 2.0, "expire_after_access": 1.0, "cache_missing_key": False},
    ],
)
@settings(max_examples=150, deadline=None)
@given(batches=_batches())
def test_get_many_and_put_many_are_get_and_put_at_one_instant(
    kwargs: dict[str, Any], batches: list[tuple[str, float, list[tuple[str, str | None]]]]
) -> None:
    clocks = FakeClock(), FakeClock()
    one: LookupCache[str, str] = LookupCache(3, clock=clocks[0], **kwargs)
    many: LookupCache[str, str] = LookupCache(3, clock=clocks[1], **kwargs)
    for kind, advance, ops in batches:
        for clock in clocks:
            clock.advance(advance)
        if kind == "get":
            keys = [key for key, _ in ops]
            got = many.get_many(keys)
            assert [h if h is None else h.row for h in (one.get(k) for k in keys)] == [
                h if h is None else h.row for h in got
            ]
        else:
            for key, row in ops:
                one.put(key, row)
            many.put_many(ops)
        assert rows(one, *"abcdefg") == rows(many, *"abcdefg")
        assert (one.hits, one.misses, one.loads, one.evictions) == (
            many.hits,
            many.misses,
            many.loads,
            many.evictions,
        )
