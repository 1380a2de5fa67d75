"""An upsert sink's checkpoint as ONE Iceberg ``overwrite`` snapshot: delete by key, then
append — copy-on-write, without PyIceberg's own write path (which needs ``pyiceberg-core``
for partitioned tables and commits two snapshots).

1. the checkpoint's staged rows, one per key: the row of the latest event (``latest_by``, the
   event time), then the last staged, as in the Postgres sink;
2. the table's data files that may hold one of the keys: a scan plan with an ``In`` filter
   (partition and column statistics prune it);
3. each such file is read; a stored row whose event is later than the checkpoint's row of
   its key stays, and that checkpoint row is dropped (a late record, a rebuild of an older
   day: the latest event of a key stays, whatever the order of processing); the other stored
   rows of the keys are removed — the file is rewritten without them (a new file next to it;
   an empty remainder is simply dropped);
4. the staged files keep the rows that won: a staged file that lost rows is rewritten (a
   change stream's winning delete — ``op_field`` value ``d`` — removed the stored rows of its
   key in step 3 and is itself never written);
5. one overwrite: the rewritten files' originals deleted, the rewrites and the checkpoint's
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
from spark_jobs.sink._latest import latest_rank

__all__ = ["ROWS_WRITTEN", "stage_upsert"]

#: The snapshot summary property of an upsert: the checkpoint's rows it wrote.
ROWS_WRITTEN = "sluice.rows-written"

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
    parts = [pc.cast(rows.column(k).combine_chunks(), pa.string()) for k in key]
    joined: pa.Array = pc.binary_join_element_wise(*parts, _SEPARATOR)
    return joined


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


class _Incoming:
    """Step 1: the checkpoint's staged files and, per key, the row that wins among them."""

    def __init__(
        self,
        entries: Sequence[dict[str, Any]],
        key: Sequence[str],
        latest_by: str | None,
        storage: StorageOptions | None,
        op_field: str | None = None,
    ) -> None:
        self.op_field = op_field
        self.uris = [table_uri(str(e["staged"])) for e in entries]
        self.parts = [_read(str(e["staged"]), storage) for e in entries]
        rows = pa.concat_tables(self.parts).combine_chunks() if self.parts else pa.table({})
        self.winner = pa.array([], pa.bool_())
        self.keys = pa.array([])
        self.times: pa.Array | None = None
        if rows.num_rows:
            rank = latest_rank(rows, latest_by)
            keyed = pa.table({"k": _keys(rows, key), "r": rank})
            best = keyed.group_by("k", use_threads=False).aggregate([("r", "max")])
            self.winner = pc.is_in(rank, value_set=best.column("r_max"))
            won = rows.filter(self.winner)
            self.keys = _keys(won, key)  # one per key
            self.times = None if latest_by is None else won.column(latest_by).combine_chunks()
        self.rows = rows.select(list(key)) if rows.num_rows else rows
        self.lost = pa.array([], self.keys.type)
        self.written = 0  # (set by ``files``: the rows that won)

    def outranked(self, stored: pa.Table, key: Sequence[str], latest_by: str | None) -> pa.Array:
        """Step 3: per stored row, whether it stays (its event is later than the checkpoint's
        row of its key); those keys' checkpoint rows are dropped."""
        position = pc.index_in(_keys(stored, key), value_set=self.keys)
        if latest_by is None or self.times is None:
            return pc.is_null(position)  # (no key of ours: stays)
        incoming = pc.take(self.times, position)
        at = stored.column(latest_by).combine_chunks()
        later = pc.and_(pc.is_valid(at), pc.or_kleene(pc.is_null(incoming), pc.less(incoming, at)))
        stays = pc.or_(pc.is_null(position), pc.fill_null(later, False))
        beaten = pc.filter(_keys(stored, key), pc.and_(pc.is_valid(position), stays))
        self.lost = pa.concat_arrays([self.lost, beaten.cast(self.lost.type)])
        return stays

    def files(self, key: Sequence[str], storage: StorageOptions | None) -> list[str]:
        """Step 4: the staged files holding exactly the rows that won."""
        files, start = [], 0
        self.written = 0
        for uri, part in zip(self.uris, self.parts, strict=True):
            size = part.num_rows
            mask = self.winner.slice(start, size)
            start += size
            if self.op_field is not None:  # a delete is applied, never written
                upsert = pc.not_equal(part.column(self.op_field).combine_chunks(), "d")
                mask = pc.and_(mask, pc.fill_null(upsert, True))
            if len(self.lost):
                mask = pc.and_(mask, pc.invert(pc.is_in(_keys(part, key), value_set=self.lost)))
            self.written += int(pc.sum(mask.cast(pa.int64())).as_py() or 0)
            if pc.all(mask).as_py():
                files.append(uri)
            elif pc.any(mask).as_py():
                files.append(_write(part.filter(mask), _sibling(uri, "last"), storage))
        return files


def stage_upsert(
    tx: Transaction,
    table: Table,
    entries: Sequence[dict[str, Any]],
    key: Sequence[str],
    storage: StorageOptions | None,
    props: dict[str, str],
) -> None:
    """Steps 1-5 into ``tx`` (the caller commits it)."""
    latest_by = entries[0].get("latest_by") if entries else None
    op_field = entries[0].get("op_field") if entries else None
    incoming = _Incoming(entries, key, latest_by, storage, op_field)
    deleted: list[DataFile] = []
    added: list[DataFile] = []
    if len(incoming.keys) and table.current_snapshot() is not None:
        # Steps 2-3: files that hold a key lose those rows (copy-on-write), unless later.
        for task in table.scan(row_filter=_key_filter(incoming.rows, key)).plan_files():
            stored = _read(task.file.file_path, storage)
            stays = incoming.outranked(stored, key, latest_by)
            if pc.all(stays).as_py():
                continue  # none of the keys, or only later events of them
            deleted.append(task.file)
            remainder = stored.filter(stays)
            if remainder.num_rows:
                uri = _write(remainder, _sibling(task.file.file_path, "cow"), storage)
                added.append(parquet_file_to_data_file(table.io, table.metadata, uri))
    files = incoming.files(key, storage)
    added += [parquet_file_to_data_file(table.io, table.metadata, uri) for uri in files]
    # Step 5: one snapshot; its rows written (added-records also counts the rows the
    # copy-on-write carried over).
    props = {**props, ROWS_WRITTEN: str(incoming.written)}
    with tx.update_snapshot(snapshot_properties=props).overwrite() as overwrite:
        for data_file in deleted:
            overwrite.delete_data_file(data_file)
        for data_file in added:
            overwrite.append_data_file(data_file)
