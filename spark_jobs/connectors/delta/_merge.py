"""Upserts: a checkpoint's staged rows merged into the Delta table by key.

The staged files of an upsert sink are never added to the table: they are the source of one
``MERGE`` (delta-rs ``DeltaTable.merge``) per checkpoint — a target row whose key matches a
staged row is replaced by it (partition column included: a row may move to another day), a
staged row without a match is inserted — unless the target row's event time (``latest_by``)
is later: the latest event of a key stays, whatever the order of processing (a late record, a
rebuild of an older day). Within a checkpoint the row of the latest event wins, then the last
staged (transactions by id, then file order), as in the Postgres sink. The merge commit
carries the same app transaction as an append would, so the checkpoint's committer checks
(and recovery repeats) it the same way; once committed, the staged files are deleted.
A null key never matches (SQL equality): such rows are inserted every time. A change stream's
upsert (``op_field``, a CDC source's ``_op``) also deletes: a winning row whose operation is
``d`` deletes the matching target row (unless that one is of a later ``latest_by``) and is
never inserted.

Threading: blocking store I/O; the committer's thread, under the table lock.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable

from enumerator_service import StorageOptions, open_location
from spark_jobs.sink._latest import latest_rank
from spark_jobs.sink._object_store import delete_object

__all__ = ["merge_files"]

_SEQ = "__sluice_seq"


def _source(
    table: DeltaTable,
    entries: list[dict[str, Any]],
    key: list[str],
    latest_by: str | None,
    options: StorageOptions | None,
) -> pa.Table:
    """The staged rows (with the partition column), the latest per key."""
    target = pa.schema(table.schema().to_arrow())
    parts = []
    for entry in entries:
        location = open_location(entry["staged"], options)
        rows = pq.read_table(location.path, filesystem=location.fs)
        partition = entry.get("partition")
        if partition:
            day = pa.scalar(entry["day"]).cast(pa.date32())
            rows = rows.append_column(partition, pa.array([day] * rows.num_rows, pa.date32()))
        for field in target:  # columns the table has and the output not (yet): nulls
            if field.name not in rows.column_names:
                rows = rows.append_column(field.name, pa.nulls(rows.num_rows, field.type))
        parts.append(rows.select(target.names).cast(target))
    rows = pa.concat_tables(parts)
    rows = rows.append_column(_SEQ, latest_rank(rows, latest_by))
    last = rows.group_by(key, use_threads=False).aggregate([(_SEQ, "max")])
    keep = pc.is_in(rows.column(_SEQ), value_set=last.column(f"{_SEQ}_max"))
    return rows.filter(keep).drop_columns([_SEQ])


def merge_files(
    table: DeltaTable,
    entries: list[dict[str, Any]],
    key: list[str],
    properties: CommitProperties,
    options: StorageOptions | None = None,
) -> None:
    """Merge the staged files of ``entries`` into ``table`` in one commit, then delete them."""
    latest_by = entries[0].get("latest_by") if entries else None
    source = _source(table, entries, key, latest_by, options)
    predicate = " AND ".join(f't."{name}" = s."{name}"' for name in key)
    # A stored row of a later event stays (one without an event time is older than any).
    newer = (
        None
        if latest_by is None
        else f'(t."{latest_by}" IS NULL OR t."{latest_by}" <= s."{latest_by}")'
    )
    op_field = entries[0].get("op_field") if entries else None
    merge = table.merge(
        source, predicate, source_alias="s", target_alias="t", commit_properties=properties
    )
    if op_field is not None and newer is not None:
        # The first clause that matches applies: a delete, else an update; never an insert.
        deletes = f"s.\"{op_field}\" = 'd'"
        upserts = f"COALESCE(s.\"{op_field}\", '') <> 'd'"
        merge = (
            merge.when_matched_delete(predicate=f"{deletes} AND {newer}")
            .when_matched_update_all(predicate=f"{upserts} AND {newer}")
            .when_not_matched_insert_all(predicate=upserts)
        )
    else:
        merge = merge.when_matched_update_all(predicate=newer).when_not_matched_insert_all()
    merge.execute()
    for entry in entries:
        with contextlib.suppress(OSError):  # (left over: invisible, removed by VACUUM)
            delete_object(open_location(entry["staged"], options))
