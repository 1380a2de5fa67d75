"""BatchCache (the partial cache of BatchLookup, answered per batch) against plain-dict oracles.

1. A Hypothesis state machine runs random lookups and stores (duplicate keys in the rows
   found, cached misses, a virtual clock with write and access expiry, eviction at
   ``maximum_size``) against a deliberately naive model: a dict of every key's last stored
   entry, expired entries found by scanning everything. The cache's CLOCK eviction is not
   modelled: its answers must be the model's, its keys a subset, its size bounded.
2. Random batches (duplicates within a batch, null keys; single, text and composite keys)
   through BatchLookup's cache path (``_cached`` / ``_remember`` / ``Answer.rows``) and a
   dict "database": each batch's rows must be exactly those of the uncached lookup (the
   database alone), whatever the cache held.
"""

from __future__ import annotations

import types
from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from spark_jobs.lookup._batch_cache import Answer, BatchCache
from spark_jobs.lookup._batch_join import Found, distinct_keys, match
from spark_jobs.lookup._batch_lookup import BatchLookup, _as_parts
from spark_jobs.lookup._cache_index import MIN_DELTA, KeyIndex
from spark_jobs.lookup._cache_rows import MIN_GARBAGE, MIN_TAIL, RowLog, take_rows
from spark_jobs.lookup._hit_rate_guard import HitRateGuard

TYPES = [pa.string(), pa.int64()]
KEYS = st.integers(0, 12)


def row_of(key: int, version: int) -> tuple[str, int]:
    return (f"row {key} v{version}", key * 10 + version)


def ask(cache: BatchCache, keys: list[int]) -> tuple[Answer, dict[int, Any]]:
    """Look ``keys`` up: the answer, and each key's entry (a row, None for a cached miss)."""
    answer = cache.lookup(pa.array(keys, pa.int64()), len(set(keys)))
    _rows, (names, numbers) = answer.rows([pa.array(keys, pa.int64())], None)
    entries: dict[int, Any] = {}
    for key, kind, name, number in zip(
        keys, answer.kinds.to_pylist(), names.to_pylist(), numbers.to_pylist(), strict=True
    ):
        if kind == 1:
            entries[key] = (name, number)
        elif kind == 2:
            assert (name, number) == (None, None)
            entries[key] = None
    return answer, entries


def put(cache: BatchCache, keys: list[int], found: list[tuple[int, Any]]) -> None:
    """Store the rows ``found`` for the queried ``keys``."""
    cache.store(
        pa.array(keys, pa.int64()),
        pa.array([k for k, _ in found], pa.int64()),
        [pa.array([r[i] for _, r in found], t) for i, t in enumerate(TYPES)],
    )


def cached(cache: BatchCache, domain: range) -> dict[int, int]:
    """The keys of ``domain`` the cache holds live, with their kind (1 a row, 2 a miss),
    read without a lookup (no recency, no counters)."""
    keys = pa.array(list(domain), pa.int64())
    kinds = cache._live().take(cache._index.probe(keys)).to_pylist()
    return {k: kind for k, kind in zip(domain, kinds, strict=True) if kind}


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
        if often:  # compact the log's garbage, merge its tail, rebuild the index's base often
            RowLog.min_garbage = RowLog.min_tail = KeyIndex.min_delta = 0
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

    @rule(keys=st.lists(KEYS, max_size=10))
    def lookup(self, keys: list[int]) -> None:
        answer, entries = ask(self.cache, keys)
        missing = set(answer.missing.to_pylist())
        assert missing == set(keys) - set(entries)
        assert len(answer.missing) == len(missing)  # distinct
        # A key answered is answered with its last stored entry, unexpired (and is accessed
        # now); a key not answered (evicted, expired or never stored) is queried.
        model, now = self.model, self.clock.now
        model.purge(now)
        for key, entry in entries.items():
            assert key in model.entries and model.entries[key][0] == entry
            model.entries[key][2] = now
        assert self.cache.hits - self.hits_before == len(set(keys)) - len(missing)
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
        put(self.cache, keys, found)
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
        # Every cached key is the model's: a row (kind 1) or a cached miss (kind 2).
        held = cached(cache, range(13))
        for key, kind in held.items():
            assert (kind == 1) == (self.model.entries[key][0] is not None)
        log = cache._log
        assert len(held) == len(cache) == sum(1 for flag in log.live if flag)
        # The log holds the live rows and bounded garbage.
        assert log.end - 1 <= 2 * max(len(cache), 4096) + 10

    def teardown(self) -> None:
        RowLog.min_garbage, RowLog.min_tail, KeyIndex.min_delta = MIN_GARBAGE, MIN_TAIL, MIN_DELTA


TestBatchCacheMachine = BatchCacheMachine.TestCase
TestBatchCacheMachine.settings = settings(max_examples=80, stateful_step_count=30, deadline=None)


def test_eviction_spares_the_recently_used_and_is_counted() -> None:
    cache = BatchCache(2, TYPES, expire_after_access=60)
    put(cache, [1, 2], [(1, ("a", 1)), (2, ("b", 2))])
    assert ask(cache, [1])[1] == {1: ("a", 1)}  # 1 is now used, 2 is not
    put(cache, [3], [(3, ("c", 3))])
    answer, entries = ask(cache, [1, 2, 3])
    assert answer.missing.to_pylist() == [2] and entries == {1: ("a", 1), 3: ("c", 3)}
    assert (cache.hits, cache.misses, cache.loads, cache.evictions) == (3, 1, 3, 1)


def test_without_access_expiry_a_used_key_gets_a_second_chance() -> None:
    cache = BatchCache(2, TYPES)  # CLOCK
    put(cache, [1, 2], [(1, ("a", 1)), (2, ("b", 2))])
    ask(cache, [1])  # marks 1: at the head, it is kept and 2 is evicted
    put(cache, [3], [(3, ("c", 3))])
    assert ask(cache, [1, 2, 3])[0].missing.to_pylist() == [2]
    # 3 and 1 are marked: both get their second chance, so the unused 4 is evicted.
    put(cache, [4], [(4, ("d", 4))])
    assert sorted(cached(cache, range(5))) == [1, 3] and cache.evictions == 2


def test_two_batches_missing_one_key_store_it_once() -> None:
    """Two blocks in flight both miss a key and both store it: the second store finds the
    first's entry and replaces it (one live entry, the latest row)."""
    cache = BatchCache(10, TYPES)
    keys = pa.array([7], pa.int64())
    first, second = cache.lookup(keys, 1), cache.lookup(keys, 1)
    for answer, name in ((first, "a"), (second, "b")):
        cache.store(keys, keys, [pa.array([name]), pa.array([7])], answer=answer)
    assert len(cache) == 1 and ask(cache, [7])[1] == {7: ("b", 7)}
    # A store right after its own lookup skips that search: the key is still not cached.
    answer = cache.lookup(pa.array([8], pa.int64()), 1)
    cache.store(pa.array([8]), pa.array([8]), [pa.array(["c"]), pa.array([8])], answer=answer)
    assert len(cache) == 2 and ask(cache, [8, 7])[1] == {8: ("c", 8), 7: ("b", 7)}


def test_the_log_takes_rows_of_base_and_tail_in_the_positions_order() -> None:
    """One take over the base and the tail's batches: the rows come in the order asked."""
    log = RowLog(TYPES, frozenset())
    for keys in ([0, 1, 2], [3, 4], [5]):
        rows = [row_of(key, 0) for key in keys]
        columns = [pa.array([r[i] for r in rows], t) for i, t in enumerate(TYPES)]
        nulls = 1 if keys == [3, 4] else 0
        log.append(columns, nulls, b"\1" * len(keys) + b"\2" * nulls, 0.0)
        if keys == [0, 1, 2]:
            log.merge()  # the base; the next batches stay in the tail
    # Row of key k at index k, except the nulls row (a cached miss) at index 5 and key 5's
    # row at 6; a null index is a null row.
    rows = [6, 0, 4, 3, 5, None, 2]
    names, numbers = take_rows(log.schema, log.chunks(), pa.array(rows, pa.int64()))
    expected = [row_of(r - (r == 6), 0) if r not in (5, None) else (None, None) for r in rows]
    assert list(zip(names.to_pylist(), numbers.to_pylist(), strict=True)) == expected
    log.merge()
    assert take_rows(log.schema, log.chunks(), pa.array([2, 0]))[0].to_pylist() == [
        "row 2 v0",
        "row 0 v0",
    ]


def test_many_batches_compact_the_log_and_keep_every_row() -> None:
    cache = BatchCache(5_000, TYPES)
    for batch in range(40):
        keys = list(range(batch * 100, batch * 100 + 3_000))
        answer, entries = ask(cache, keys)
        assert all(entry is not None and entry[1] == key for key, entry in entries.items())
        missing = answer.missing.to_pylist()
        put(cache, missing, [(k, (str(k), k)) for k in missing])
        assert len(cache) <= 5_000
        assert cache._log.end - 1 <= 2 * max(len(cache), 4096) + 3_000
    assert cache.evictions > 0


# -- through BatchLookup's cache path: identical to the uncached lookup -------------------

# Keys of three shapes over one "database": an int, a text (with the composite encoding's
# escape byte in it), and a composite (int, text) key. Ints 0, 5, 10, ...: no row.
SHAPES: dict[str, list[pa.DataType]] = {
    "int": [pa.int64()],
    "text": [pa.string()],
    "composite": [pa.int64(), pa.string()],
}


def key_of(shape: str, n: int) -> tuple[Any, ...]:
    text = f"k\x01{n % 3}" if n % 2 else f"k{n % 3}\x01\x02"
    return {"int": (n,), "text": (f"{n}{text}",), "composite": (n // 3, text)}[shape]


def database(shape: str) -> dict[tuple[Any, ...], tuple[str, int]]:
    return {key_of(shape, n): (f"user {n}", n * 7) for n in range(0, 40) if n % 5 != 0}


def fetch(shape: str, missing: list[pa.Array]) -> Found:
    """The database's answer for distinct keys: their rows (absent keys have none)."""
    table = database(shape)
    keys = [k for k in zip(*(part.to_pylist() for part in missing), strict=True) if k in table]
    return Found(
        tuple(pa.array([k[i] for k in keys], t) for i, t in enumerate(SHAPES[shape])),
        (
            pa.array([table[k][0] for k in keys], pa.string()),
            pa.array([table[k][1] for k in keys], pa.int64()),
        ),
    )


def lookup_path(size: int, min_hit_rate: float, clock: Clock) -> Any:
    self = types.SimpleNamespace()
    self._cache = BatchCache(size, TYPES, expire_after_write=5, clock=clock)
    self._guard = HitRateGuard(min_hit_rate, window=20, pause=1)
    self.cache_hits = self.cache_misses = self.cache_bypassed = 0
    return self


def one_batch(path: Any, shape: str, keys: list[pa.Array]) -> list[Any]:
    """Each row's looked-up columns (None: unmatched) through BatchLookup's cache path."""
    answer, counted = BatchLookup._cached(path, keys)
    if answer is None:  # bypassed: the uncached lookup, of the keys the guard counted
        missing = _as_parts(keys, counted) or distinct_keys(keys)
        found = fetch(shape, missing)
        rows = match(keys, found.keys)
        columns = [column.take(rows) for column in found.values]
    else:
        fetched = None
        if answer.absent is not None:
            absent = [k.filter(answer.absent) for k in keys]
            missing = _as_parts(keys, answer.missing) or distinct_keys(absent)
            fetched = fetch(shape, missing)
            BatchLookup._remember(path, answer, missing, fetched)
        rows, columns = answer.rows(keys, fetched)
    values = zip(rows.to_pylist(), *(column.to_pylist() for column in columns), strict=True)
    return [None if row is None else tuple(v) for row, *v in values]


@settings(max_examples=60, deadline=None)
@given(
    shape=st.sampled_from(sorted(SHAPES)),
    size=st.integers(1, 30),
    min_hit_rate=st.sampled_from([0.0, 0.5, 1.0]),
    often=st.booleans(),
    batches=st.lists(
        st.tuples(st.lists(st.none() | st.integers(0, 45), max_size=25), st.integers(0, 3)),
        max_size=25,
    ),
)
def test_cached_batches_equal_the_uncached_lookup(
    shape: str,
    size: int,
    min_hit_rate: float,
    often: bool,
    batches: list[tuple[list[int | None], int]],
) -> None:
    clock = Clock()
    path = lookup_path(size, min_hit_rate, clock)
    table = database(shape)
    if often:  # rebuild the index's base and compact the log at nearly every store
        RowLog.min_garbage = RowLog.min_tail = KeyIndex.min_delta = 0
    try:
        for numbers, seconds in batches:
            clock.now += seconds
            tuples = [None if n is None else key_of(shape, n) for n in numbers]
            keys = [
                pa.array([None if k is None else k[i] for k in tuples], t)
                for i, t in enumerate(SHAPES[shape])
            ]
            # The oracle, computed independently: the database alone.
            assert one_batch(path, shape, keys) == [
                None if k is None else table.get(k) for k in tuples
            ]
    finally:
        RowLog.min_garbage, RowLog.min_tail, KeyIndex.min_delta = MIN_GARBAGE, MIN_TAIL, MIN_DELTA
    asked = path.cache_hits + path.cache_misses + path.cache_bypassed
    assert asked == sum(len({n for n in numbers if n is not None}) for numbers, _ in batches)


def test_cache_keys_are_queried_as_key_parts_only_when_they_are_the_keys_themselves() -> None:
    ints = [pa.array([3, None, 3, 1], pa.int64())]
    assert _as_parts(ints, pa.array([3, 1], pa.int64())) == [pa.array([3, 1], pa.int64())]
    assert _as_parts(ints, None) is None
    decimals = [pa.array([1], pa.decimal128(5, 1))]  # cached as text: not a key part
    assert _as_parts(decimals, pa.array(["1.0"])) is None
    pair = [pa.array([1], pa.int64()), pa.array(["a"])]  # composite: one binary cache key
    assert _as_parts(pair, pa.array([b"1\x01\x01a"], pa.binary())) is None
