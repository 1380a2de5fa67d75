"""KeyIndex (the partial cache's sorted probe structure) and cache_keys, against plain Python.

1. Random adds (keys given twice, entries going stale, base rebuilds at every size) then
   probes of random keys with duplicates and nulls: each probe answers the newest entry of
   its key (or none once it is stale), and through the live flags exactly a dict model's
   live entries.
2. ``cache_keys`` of composite keys (text with the escape bytes, binary, ints, nulls): two
   rows' encodings are equal exactly when their parts are.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_jobs.lookup._cache_index import MIN_DELTA, KeyIndex, cache_keys

KEYS = st.none() | st.integers(-5, 30)
ADDS = st.lists(
    st.tuples(st.lists(st.integers(-5, 30), max_size=8), st.lists(st.booleans(), max_size=8)),
    max_size=30,
)


@settings(max_examples=150, deadline=None)
@given(
    adds=ADDS,
    probes=st.lists(KEYS, max_size=40),
    text=st.booleans(),
    min_delta=st.sampled_from([0, 3, MIN_DELTA]),
)
def test_probes_answer_the_newest_live_entry(
    adds: list[tuple[list[int], list[bool]]], probes: list[int | None], text: bool, min_delta: int
) -> None:
    KeyIndex.min_delta = min_delta  # 0: the base is rebuilt at nearly every add
    try:
        _adds_then_probes(adds, probes, pa.string() if text else pa.int64())
    finally:
        KeyIndex.min_delta = MIN_DELTA


def _adds_then_probes(
    adds: list[tuple[list[int], list[bool]]], probes: list[int | None], kind: pa.DataType
) -> None:
    text = kind == pa.string()

    def arrow(keys: list[int | None]) -> pa.Array:
        return pa.array([None if k is None else (str(k) if text else k) for k in keys], kind)

    index = KeyIndex()
    live = bytearray(1)  # by position; 0: never an entry
    newest: dict[int, int] = {}  # the model: key -> position of its newest entry
    for keys, kills in adds:
        # A store kills its keys' older entries (a key has one live position, its newest),
        # then some entries go stale (evicted). A key given twice: as the cache's store, the
        # first is live (and the newer), the others are garbage from the start.
        for key in keys:
            if key in newest:
                live[newest[key]] = 0
        start = len(live)
        live += bytes(1 if key not in keys[:i] else 0 for i, key in enumerate(keys))
        index.add(arrow(keys), pa.array(range(start, len(live)), pa.int64()), _flags(live))
        for key, position in reversed(list(zip(keys, range(start, len(live)), strict=True))):
            newest[key] = position
        for position, kill in zip(range(start, len(live)), kills, strict=False):
            live[position] = 0 if kill else live[position]
        # A live entry is found; a stale one may be (until a rebuild drops it).
        found = index.probe(arrow(probes)).to_pylist()
        for key, position in zip(probes, found, strict=True):
            expected = None if key is None else newest.get(key, 0)
            assert position == expected or (position == 0 and not live[expected])
        alive = pc.not_equal(_flags(live).take(index.probe(arrow(probes))), 0).to_pylist()
        assert alive == [None if k is None else bool(live[newest.get(k, 0)]) for k in probes]


def test_renumber_keeps_the_live_entries_at_their_new_positions() -> None:
    index = KeyIndex()
    live = bytearray([0, 1, 1, 1, 1])
    index.add(pa.array([10, 20, 30, 40]), pa.array([1, 2, 3, 4], pa.int64()), _flags(live))
    live[2] = 0  # 20 evicted; the log keeps 1, 3, 4 as 1, 2, 3
    index.renumber(pa.array([1, 3, 4], pa.int64()), _flags(live))
    assert index.probe(pa.array([10, 20, 30, 40, None])).to_pylist() == [1, 0, 2, 3, None]
    index.clear()
    assert index.probe(pa.array([10, None])).to_pylist() == [0, None]


PART = st.one_of(
    st.none(),
    st.integers(-3, 3),
    st.text(alphabet="a\x01\x02", max_size=4),
    st.binary(max_size=3),
)


@settings(max_examples=300, deadline=None)
@given(rows=st.lists(st.tuples(PART, PART, PART), min_size=1, max_size=12))
def test_composite_cache_keys_are_equal_exactly_when_the_parts_are(
    rows: list[tuple[Any, Any, Any]],
) -> None:
    # One column per part position and type: ints, text, binary (a part of another type
    # counts as null in that column, as a join-typed column holds one type).
    def column(i: int, kind: pa.DataType, accept: type) -> tuple[pa.Array, list[Any]]:
        values = [r[i] if isinstance(r[i], accept) else None for r in rows]
        return pa.array(values, kind), values

    ints, a = column(0, pa.int64(), int)
    texts, b = column(1, pa.string(), str)
    blobs, c = column(2, pa.binary(), bytes)
    coded = cache_keys([ints, texts, blobs]).to_pylist()
    parts = list(zip(a, b, c, strict=True))
    for i, x in enumerate(parts):
        assert (coded[i] is None) == (None in x)
        for j, y in enumerate(parts):
            if None not in x and None not in y:
                assert (coded[i] == coded[j]) == (x == y), (x, y)


def test_a_single_key_is_its_own_cache_key_and_a_decimal_its_text() -> None:
    ints = pa.array([3, None, 1])
    assert cache_keys([ints]) is ints
    decimals = pa.array([1, 2], pa.decimal128(38, 2))
    assert cache_keys([decimals]).to_pylist() == ["1.00", "2.00"]


def _flags(live: bytearray) -> pa.Array:
    return pa.array(list(live), pa.uint8())
