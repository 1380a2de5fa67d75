"""Split registration: idempotent inserts into the split store (``SplitStore.register``).

A split's row is its codec: ``kind``, ``uri``, byte or key range, partition and (files) the
identity it was discovered with. Registration inserts only splits not yet known (the unique
``(source, uri, start_offset, file_version)`` key) and registers a split of a partition being
rebuilt HELD.

Threading: every method blocks on the database; call them from a fetcher or committer thread,
never from a mailbox thread.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.engine import Connection, Engine

from enumerator_service._rebuild_lock import holds, lock_rebuilds
from enumerator_service._schema import SplitStatus, splits
from enumerator_service._splits import FileSplit, Split

__all__ = ["SplitRegistration"]

_COLUMNS = (
    "source",
    "kind",
    "uri",
    "start_offset",
    "end_offset",
    "partition_key",
    "file_size",
    "file_mtime_ns",
    "file_inode",
    "file_version",
)


def _row_of(split: Split) -> dict[str, object]:
    file = split.file if isinstance(split, FileSplit) else None
    return {
        "source": split.source,
        "kind": split.kind,
        "uri": split.path,
        "start_offset": split.start,
        "end_offset": split.end,
        "partition_key": split.partition_key,
        "file_size": file.size if file is not None else None,
        "file_mtime_ns": file.mtime_ns if file is not None else None,
        "file_inode": file.inode if file is not None else None,
        "file_version": split.version if isinstance(split, FileSplit) else 0,
    }


def _insert(conn: Connection, rows: list[dict[str, object]]) -> list[int]:
    # One array parameter per column, expanded server-side by unnest(): a fixed statement
    # (compiled once, cached) with one parameter per column, whatever the batch size. A
    # multi-row VALUES list compiles a bind parameter per row and column, which dominated
    # registration time.
    arrays = sa.func.unnest(
        *(sa.bindparam(f"{name}_array", type_=sa.ARRAY(splits.c[name].type)) for name in _COLUMNS)
    )
    values = arrays.table_valued(*_COLUMNS).render_derived(name="v")
    rebuilding = holds(values.c.source, values.c.partition_key)
    status = sa.case(
        (rebuilding, sa.literal(SplitStatus.HELD.value)),
        else_=sa.literal(SplitStatus.UNASSIGNED.value),
    )
    stmt = (
        insert(splits)
        .from_select(
            (*_COLUMNS, "status"),
            sa.select(*(values.c[name] for name in _COLUMNS), status),
        )
        .on_conflict_do_nothing(index_elements=["source", "uri", "start_offset", "file_version"])
        .returning(splits.c.id)
    )
    params = {f"{name}_array": [row[name] for row in rows] for name in _COLUMNS}
    return list(conn.execute(stmt, params).scalars())


class SplitRegistration:
    """The registration part of ``SplitStore`` (thread-safe: one Engine, no other state)."""

    _engine: Engine

    def register(self, new_splits: Iterable[Split], *, batch_size: int = 5000) -> int:
        """Insert splits not yet known; returns how many were new. Idempotent.

        A split of a partition being rebuilt (any split of a source rebuilding an event day)
        is registered HELD: it joins the pool when the rebuild's swap releases it (see
        ``enumerator_service._rebuilds``).
        """
        added = 0
        batch: list[Split] = []
        with self._engine.begin() as conn:
            for split in new_splits:
                batch.append(split)
                if len(batch) >= batch_size:
                    added += len(self.insert(conn, batch))
                    batch = []
            if batch:
                added += len(self.insert(conn, batch))
        return added

    @staticmethod
    def insert(conn: Connection, new_splits: Sequence[Split]) -> list[int]:
        """``register`` inside the caller's transaction: the ids of the splits that were new."""
        # Shared with other registrations, exclusive with a rebuild's start and swap: a
        # split is either seen by the swap's release or registered after it.
        for source in sorted({split.source for split in new_splits}):
            lock_rebuilds(conn, source, shared=True)
        return _insert(conn, [_row_of(split) for split in new_splits]) if new_splits else []
