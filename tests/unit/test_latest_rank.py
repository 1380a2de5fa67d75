"""Which staged row of a key an upsert keeps (``spark_jobs.sink._latest.latest_rank``): the
row with the latest event time, among equal times the one staged last; a null time is older
than any. Hypothesis over rows in any order, against a plain-Python oracle."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from spark_jobs.sink._latest import born_rows, latest_rank, latest_rows

_T0 = datetime(2026, 1, 1, tzinfo=UTC)
rows = st.lists(
    st.tuples(st.integers(0, 4), st.none() | st.integers(0, 5)), min_size=0, max_size=40
)


def _winners(ranked: list[int], keys: list[int]) -> dict[int, int]:
    best: dict[int, int] = {}
    for index, (key, rank) in enumerate(zip(keys, ranked, strict=True)):
        if key not in best or rank > ranked[best[key]]:
            best[key] = index
    return best


@given(rows)
def test_the_latest_event_then_the_last_staged_wins(data: list[tuple[int, int | None]]) -> None:
    keys = [k for k, _ in data]
    times = [None if t is None else _T0 + timedelta(seconds=t) for _, t in data]
    table = pa.table({"k": keys, "t": pa.array(times, pa.timestamp("us", tz="UTC"))})
    ranked = latest_rank(table, "t").to_pylist()
    assert sorted(ranked) == list(range(len(data)))  # distinct ranks
    expected: dict[int, int] = {}
    for index, (key, t) in enumerate(data):
        seen = expected.get(key)
        older = seen is not None and (
            data[seen][1] is None or (t is not None and t >= data[seen][1])
        )
        if seen is None or older:
            expected[key] = index
    assert _winners(ranked, keys) == expected


@given(rows)
def test_without_an_event_time_the_last_staged_wins(data: list[tuple[int, int | None]]) -> None:
    keys = [k for k, _ in data]
    ranked = latest_rank(pa.table({"k": keys}), None).to_pylist()
    assert _winners(ranked, keys) == {k: max(i for i, x in enumerate(keys) if x == k) for k in keys}


@given(rows, st.booleans())
def test_latest_rows_keeps_exactly_the_winner_of_each_key_in_order(
    data: list[tuple[int, int | None]], timed: bool
) -> None:
    keys = [k for k, _ in data]
    times = [None if t is None else _T0 + timedelta(seconds=t) for _, t in data]
    seq = list(range(len(data)))
    table = pa.table(
        {"k": keys, "t": pa.array(times, pa.timestamp("us", tz="UTC")), "seq": seq},
        schema=pa.schema(
            [("k", pa.int64()), ("t", pa.timestamp("us", tz="UTC")), ("seq", pa.int64())]
        ),
    )
    kept = latest_rows(table, ["k"], "t" if timed else None)
    # The oracle: per key, the row the commit's DISTINCT ON keeps (plain Python).
    expected: dict[int, int] = {}
    for index, (key, t) in enumerate(data):
        seen = expected.get(key)
        if timed:
            later = seen is not None and (
                data[seen][1] is None or (t is not None and t >= data[seen][1])
            )
        else:
            later = True
        if seen is None or later:
            expected[key] = index
    assert kept.column("seq").to_pylist() == sorted(expected.values())  # once each, in order
    assert kept.schema == table.schema


@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 5)), max_size=40))
def test_times_in_staging_order_rank_in_staging_order(data: list[tuple[int, int]]) -> None:
    # A change stream's rows come in LSN order: ranked without a sort, the same ranks.
    data = sorted(data, key=lambda row: row[1])
    times = pa.array([_T0 + timedelta(seconds=t) for _, t in data], pa.timestamp("us", tz="UTC"))
    ranked = latest_rank(pa.table({"k": [k for k, _ in data], "t": times}), "t").to_pylist()
    assert ranked == list(range(len(data)))


def test_a_null_time_takes_the_sorting_path() -> None:
    times = pa.array([_T0, None, _T0], pa.timestamp("us", tz="UTC"))
    assert latest_rank(pa.table({"t": times}), "t").to_pylist() == [1, 0, 2]


@given(st.lists(st.tuples(st.integers(0, 4), st.sampled_from(["c", "u", "d", None])), max_size=40))
def test_born_rows_mark_keys_whose_first_change_created_them(
    data: list[tuple[int, str | None]],
) -> None:
    # A change stream's hand-over, in LSN order: the kept rows are latest_rows' and say
    # whether the key's first change in the hand-over was an insert ("c").
    table = pa.table(
        {
            "k": pa.array([k for k, _ in data], pa.int64()),
            "lsn": pa.array(range(len(data)), pa.int64()),
            "op": pa.array([op for _, op in data], pa.string()),
        }
    )
    marked = born_rows(table, ["k"], "lsn", "op", "c", "__born")
    kept = latest_rows(table, ["k"], "lsn")
    assert marked.drop_columns(["__born"]) == kept
    assert marked.schema.field("__born").type == pa.bool_()
    assert not marked.schema.field("__born").nullable
    first: dict[int, str | None] = {}
    for key, op in data:
        first.setdefault(key, op)
    assert marked.column("__born").to_pylist() == [
        first[k] == "c" for k in marked.column("k").to_pylist()
    ]
