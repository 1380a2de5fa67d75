"""An upsert sink's checkpoint as ONE Iceberg ``overwrite`` snapshot: delete by key, then
append — copy-on-write, without PyIceberg's own write path (which needs ``pyiceberg-core``
for partitioned tables and commits two snapshots).

1. the checkpoint's staged files, one row per key (the last staged wins, as in the Postgres
   sink): a staged file that lost rows to a later one is rewritten without them;
2. the table's data files that may hold one of the keys: a scan plan with an ``In`` filter
   (partition and column statistics prune it);
3. each such file is read and, when it does hold a key, rewritten without those rows (a new
   file next to it; an empty remainder is simply dropped);
4. one overwrite: the rewritten files' originals deleted, the rewrites and the checkpoint's
   files added.

Cost: every data file whose statistics admit one of the checkpoint's keys is read, and
rewritten when it holds one — cheap for a dimension-sized table or keys clustered by day,
expensive for random keys over a large table (then prefer appends and a merge in the query
engine). The rows of the checkpoint are read on the committer (driver) once.

Threading: called by the committer under the table lock.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.expressions import AlwaysTrue, And, BooleanExpression, In
from pyiceberg.io.pyarrow import parquet_file_to_data_file
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table, Transaction

from enumerator_service import StorageOptions
from spark_jobs.connectors.iceberg._catalog import location_of, table_uri

__all__ = ["stage_upsert"]

_SEPARATOR = "\x1f"


def _read(uri: str, storage: StorageOptions | None) -> pa.Table:
    where = location_of(uri, storage)
    return pq.read_table(where.path, filesystem=where.fs)


def _write(rows: pa.Table, uri: str, storage: StorageOptions | None) -> str:
    where = location_of(uri, storage)
    pq.write_table(rows, where.path, filesystem=where.fs, compression="zstd")
    return table_uri(where.uri)


def _keys(rows: pa.Table, key: Sequence[str]) -> pa.Array:
    """One comparable value per row for the (possibly composite) key."""
    if len(key) == 1:
        return rows.column(key[0]).combine_chunks()
    parts = [pc.cast(rows.column(k), pa.string()) for k in key]
    return pc.binary_join_element_wise(*parts, _SEPARATOR)


def _key_filter(rows: pa.Table, key: Sequence[str]) -> BooleanExpression:
    """A filter admitting every row with one of ``rows``' keys (per column: a superset for
    a composite key, made exact when the files are read)."""
    expression: BooleanExpression = AlwaysTrue()
    for name in key:
        values = pc.unique(rows.column(name)).drop_null().to_pylist()
        expression = And(expression, In(term=name, literals=values))
    return expression


def _sibling(uri: str, tag: str) -> str:
    stem = uri[: -len(".parquet")] if uri.endswith(".parquet") else uri
    return f"{stem}-{tag}-{uuid.uuid4().hex[:12]}.parquet"


def _latest_rows(
    entries: Sequence[dict[str, Any]], key: Sequence[str], storage: StorageOptions | None
) -> tuple[list[str], pa.Table]:
    """Step 1: the checkpoint's files holding one row per key, and those rows' keys."""
    parts = [_read(str(e["staged"]), storage) for e in entries]
    if not parts:
        return [], pa.table({})
    sizes = [p.num_rows for p in parts]
    rows = pa.concat_tables(parts).combine_chunks()
    order = pa.array(range(rows.num_rows), pa.int64())
    numbered = pa.table({"k": _keys(rows, key), "n": order})
    keep = set(numbered.group_by("k").aggregate([("n", "max")]).column("n_max").to_pylist())
    files, start = [], 0
    for entry, part, size in zip(entries, parts, sizes, strict=True):
        mask = pa.array([start + i in keep for i in range(size)])
        start += size
        uri = table_uri(str(entry["staged"]))
        if pc.all(mask).as_py():
            files.append(uri)
        elif pc.any(mask).as_py():
            files.append(_write(part.filter(mask), _sibling(uri, "last"), storage))
    return files, rows.select(list(key))


def stage_upsert(
    tx: Transaction,
    table: Table,
    entries: Sequence[dict[str, Any]],
    key: Sequence[str],
    storage: StorageOptions | None,
    props: dict[str, str],
) -> None:
    """Steps 1-4 into ``tx`` (the caller commits it)."""
    files, keys = _latest_rows(entries, key, storage)
    wanted = _keys(keys, key) if keys.num_rows else pa.array([])
    deleted: list[DataFile] = []
    added = [parquet_file_to_data_file(table.io, table.metadata, uri) for uri in files]
    if keys.num_rows and table.current_snapshot() is not None:
        # Steps 2-3: files that hold a key lose those rows (copy-on-write).
        for task in table.scan(row_filter=_key_filter(keys, key)).plan_files():
            rows = _read(task.file.file_path, storage)
            hit = pc.is_in(_keys(rows, key), value_set=wanted)
            if not pc.any(hit).as_py():
                continue  # the statistics admitted it; it holds none of the keys
            deleted.append(task.file)
            remainder = rows.filter(pc.invert(hit))
            if remainder.num_rows:
                uri = _write(remainder, _sibling(task.file.file_path, "cow"), storage)
                added.append(parquet_file_to_data_file(table.io, table.metadata, uri))
    # Step 4: one snapshot.
    with tx.update_snapshot(snapshot_properties=props).overwrite() as overwrite:
        for data_file in deleted:
            overwrite.delete_data_file(data_file)
        for data_file in added:
            overwrite.append_data_file(data_file)
