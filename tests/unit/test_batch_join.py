"""The Arrow join of BatchLookup against a plain Python reference: distinct keys and match
positions for single and composite keys, nulls, duplicates, and the renumbering that keeps
composite codes from overflowing (forced with a tiny code limit)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_jobs.lookup._batch_join import MAX_CODE, distinct_keys, match

Key = tuple[Any, ...]


def columns(rows: list[Key], types: list[pa.DataType]) -> list[pa.Array]:
    return [pa.array([row[i] for row in rows], type=kind) for i, kind in enumerate(types)]


def reference_positions(batch: list[Key], found: list[Key]) -> list[int | None]:
    first: dict[Key, int] = {}
    for i, key in enumerate(found):
        first.setdefault(key, i)
    return [None if None in key else first.get(key) for key in batch]


def reference_distinct(batch: list[Key]) -> list[Key]:
    return list(dict.fromkeys(key for key in batch if None not in key))


def overflows(found: list[Key], limit: int) -> bool:
    """Whether combining ``found``'s parts exceeds ``limit`` even after renumbering."""
    if not found:
        return False
    sizes = [len({key[i] for key in found}) for i in range(len(found[0]))]
    radix = sizes[0]
    for i in range(1, len(sizes)):
        if radix * sizes[i] > limit:
            radix = len({key[:i] for key in found})  # the distinct prefixes, renumbered
            if radix * sizes[i] > limit:
                return True
        radix *= sizes[i]
    return False


TYPES = [pa.int64(), pa.string(), pa.int64()]
part = st.one_of(st.none(), st.integers(0, 4))
text = st.one_of(st.none(), st.sampled_from(["a", "b", "ü", ""]))


@settings(max_examples=200, deadline=None)
@given(
    batch=st.lists(st.tuples(part, text, part), max_size=40),
    found=st.lists(st.tuples(st.integers(0, 4), st.sampled_from(["a", "b", "ü", ""]),
                             st.integers(0, 4)), max_size=30),
    width=st.integers(1, 3),
    limit=st.sampled_from([MAX_CODE, 1, 3, 7]),
)  # fmt: skip
def test_match_and_distinct_agree_with_the_reference(
    batch: list[Key], found: list[Key], width: int, limit: int
) -> None:
    batch = [key[:width] for key in batch]
    found = [key[:width] for key in found]
    keys, rows = columns(batch, TYPES[:width]), columns(found, TYPES[:width])
    if overflows(found, limit):
        with pytest.raises(OverflowError):
            match(keys, rows, limit=limit)
    else:
        assert match(keys, rows, limit=limit).to_pylist() == reference_positions(batch, found)
    distinct = distinct_keys(keys, limit=max(limit, len(batch) ** 2))
    got = list(zip(*(d.to_pylist() for d in distinct), strict=True))
    assert got == reference_distinct(batch)


def test_composite_codes_are_renumbered_before_they_overflow() -> None:
    # Three distinct values per part among the found keys: 27 codes. With a limit of 10 the
    # first two parts' 9 codes are renumbered to the 3 the found keys use before the third
    # part joins.
    found = [(1, "a", 2), (4, "b", 0), (3, "ü", 3)]
    batch = [(4, "b", 0), (1, "a", 3), (3, "ü", 3), (0, "", 1), (None, "a", 2), (1, "a", 2)]
    keys, rows = columns(batch, TYPES), columns(found, TYPES)
    assert match(keys, rows, limit=10).to_pylist() == [1, None, 2, None, None, 0]
    assert match(keys, rows).to_pylist() == [1, None, 2, None, None, 0]
