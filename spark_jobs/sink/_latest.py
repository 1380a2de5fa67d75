"""Which staged row of a key an upsert keeps: the latest event, then the last staged."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["latest_rank", "latest_rows"]


def latest_rank(rows: pa.Table, latest_by: str | None) -> pa.Array:
    """Per row, its rank (int64, distinct) in the order "older event first, then staged
    earlier"; the row of a key with the highest rank is the one an upsert keeps.

    ``latest_by`` None: the staging order alone (rows are in staging order). A null event
    time ranks below any event time, as in the sinks' comparison with stored rows.
    """
    staged = pa.array(range(rows.num_rows), pa.int64())
    if latest_by is None or rows.num_rows == 0:
        return staged
    times = rows.column(latest_by)
    if _in_order(times):
        return staged  # (a change stream's rows come in LSN order: no sort needed)
    ordered = pa.table({"t": times, "n": staged})
    order = pc.sort_indices(
        ordered, sort_keys=[("t", "ascending", "at_start"), ("n", "ascending", "at_start")]
    )
    # The inverse permutation of ``order``: rank[order[i]] = i.
    return pc.sort_indices(order).cast(pa.int64())


def _in_order(times: pa.ChunkedArray) -> bool:
    """Whether ``times`` has no null and never decreases (staging order is then rank order:
    ties keep the staging order)."""
    if times.null_count or len(times) < 2:
        return bool(times.null_count == 0)
    later = pc.greater_equal(times.slice(1), times.slice(0, len(times) - 1))
    return bool(pc.all(later).as_py())


def latest_rows(rows: pa.Table, key: Sequence[str], latest_by: str | None) -> pa.Table:
    """Only the row of each ``key`` an upsert keeps (the highest :func:`latest_rank`), in
    their order in ``rows``: the rows it drops could never win against the one it keeps,
    whatever else a commit holds (vectorised: a group-by and a filter, no Python per row)."""
    if rows.num_rows < 2:
        return rows
    rank = latest_rank(rows, latest_by)
    names = [f"k{i}" for i in range(len(key))]
    keyed = pa.table([*(rows.column(name) for name in key), rank], names=[*names, "rank"])
    best = keyed.group_by(names, use_threads=False).aggregate([("rank", "max")])
    if best.num_rows == rows.num_rows:
        return rows
    return rows.filter(pc.is_in(rank, value_set=best.column("rank_max")))
