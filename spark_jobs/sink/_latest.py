"""Which staged row of a key an upsert keeps: the latest event, then the last staged."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["latest_rank"]


def latest_rank(rows: pa.Table, latest_by: str | None) -> pa.Array:
    """Per row, its rank (int64, distinct) in the order "older event first, then staged
    earlier"; the row of a key with the highest rank is the one an upsert keeps.

    ``latest_by`` None: the staging order alone (rows are in staging order). A null event
    time ranks below any event time, as in the sinks' comparison with stored rows.
    """
    staged = pa.array(range(rows.num_rows), pa.int64())
    if latest_by is None or rows.num_rows == 0:
        return staged
    ordered = pa.table({"t": rows.column(latest_by), "n": staged})
    order = pc.sort_indices(
        ordered, sort_keys=[("t", "ascending", "at_start"), ("n", "ascending", "at_start")]
    )
    # The inverse permutation of ``order``: rank[order[i]] = i.
    return pc.sort_indices(order).cast(pa.int64())
