"""Decoded pgoutput changes as rows of a CDC source's records.

A record is the declared columns (in the source's schema order) followed by the CDC fields
(``CDC_FIELDS``): ``_op``, ``_lsn``, ``_commit_time``, ``_before``, ``_table``. An insert's
and an update's columns come from the new tuple; a delete's from the old one (the key columns
— the others null — or, under ``REPLICA IDENTITY FULL``, the whole old row). An update that
changes the key becomes a delete of the old key and an update of the new one, so that an
upsert sink keyed on it keeps no stale row. ``_before`` is the old tuple as JSON text when
the message carries one (``FULL``: the whole row; else the key columns of a key change or a
delete), else null.

Bad input, each one line (:class:`CdcError`): a TRUNCATE of a source table; a declared
column the table no longer has (dropped, renamed); an update that leaves a declared large
(TOASTed) column unchanged — its value is not sent — on a table without ``REPLICA IDENTITY
FULL``. A column added to the table is ignored until the pipeline declares it.

Threading: owned by the stream reader's fetcher thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import orjson

from spark_jobs.connectors.postgres_cdc._pgoutput import UNCHANGED, Change, Relation, from_text

__all__ = ["CdcError", "ChangeRows", "json_default"]


class CdcError(RuntimeError):
    """A change the source cannot carry faithfully (one line; fails the run). Its SQLSTATE
    class 42 makes the run stop at once instead of retrying (see ``deterministic_error``);
    ``bad_input``: the source's input, not a refused query (exit code 2)."""

    sqlstate = "42000"
    bad_input = True


def json_default(value: Any) -> str:
    """orjson's default of ``_before`` values (bytes as hex, others as text)."""
    return value.hex() if isinstance(value, bytes) else str(value)


class ChangeRows:
    """Turns changes of known relations into record values (declared columns, then the CDC
    fields). ``tables``: the source's tables (``schema.table``); changes of other tables
    in the publication are skipped. ``key``: the column whose change makes an update a key
    change (the source's key; under ``REPLICA IDENTITY FULL`` every column is in the
    identity)."""

    def __init__(self, declared: Sequence[str], tables: Sequence[str], key: str) -> None:
        self._declared = tuple(declared)
        self._key = key
        self._tables = frozenset(tables)
        self._relations: dict[int, Relation] = {}
        # relid → (index of each declared column in the relation, key column indexes)
        self._layout: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}

    def relation(self, relation: Relation) -> None:
        """A (new) definition of a table; a declared column it lacks fails here."""
        self._relations[relation.relid] = relation
        self._layout.pop(relation.relid, None)
        if relation.qualified not in self._tables:
            return
        names = [c.name for c in relation.columns]
        missing = [n for n in self._declared if n not in names]
        if missing:
            gone = ", ".join(repr(n) for n in missing)
            raise CdcError(
                f"table {relation.qualified} has no column {gone} any more in the definition"
                " its changes still to read were written under (dropped, renamed, or added after"
                " them): a dropped column: remove it from the pipeline's schema and run on; a"
                " renamed or added one cannot be filled in those changes: take a new snapshot"
                " ('sluice cdc drop', empty the sink, discover again)"
            )
        positions = tuple(names.index(n) for n in self._declared)
        if self._key not in names:
            raise CdcError(f"table {relation.qualified} has no column {self._key!r} any more")
        keys = (names.index(self._key),)
        self._layout[relation.relid] = (positions, keys)

    def table_of(self, relid: int) -> str | None:
        found = self._relations.get(relid)
        return None if found is None else found.qualified

    @property
    def key(self) -> str:
        return self._key

    def layout_of(self, relid: int) -> tuple[Relation, tuple[int, ...]] | None:
        """A source table's relation and the index of each declared column in it; None for
        an unknown relation or another table (the reference path, :meth:`rows`, says which)."""
        layout = self._layout.get(relid)
        return None if layout is None else (self._relations[relid], layout[0])

    def rows(self, change: Change, lsn: int, committed: datetime) -> list[list[Any]]:
        """The records of one change ([] when its table is not a source table)."""
        relation = self._relations.get(change.relid)
        if relation is None:
            raise CdcError(f"change of unknown relation {change.relid} (no Relation message)")
        layout = self._layout.get(change.relid)
        if layout is None:
            return []
        positions, keys = layout
        before = self._values(relation, change.old) if change.old is not None else None
        before_json = None if before is None else self._before_json(relation, before)
        tail = [lsn, committed, before_json, relation.qualified]
        if change.op == "d":
            assert before is not None
            return [[*(before[i] for i in positions), "d", *tail]]
        assert change.new is not None
        after = self._values(relation, change.new, before if change.old_kind == "O" else None)
        out = []
        if before is not None and any(before[i] != after[i] for i in keys):
            # A key change: the old key goes (its key columns are all an upsert sink needs).
            out.append([*(before[i] for i in positions), "d", *tail])
        out.append([*(after[i] for i in positions), change.op, *tail])
        return out

    def _values(
        self,
        relation: Relation,
        texts: tuple[str | None, ...],
        old: list[Any] | None = None,
    ) -> list[Any]:
        values: list[Any] = []
        for index, (column, text) in enumerate(zip(relation.columns, texts, strict=True)):
            if text is None:
                values.append(None)
            elif text is UNCHANGED:
                if old is not None and old[index] is not UNCHANGED:
                    values.append(old[index])
                elif column.name in self._declared:
                    raise CdcError(
                        f"table {relation.qualified}: an update left the large column"
                        f" {column.name!r} unchanged and Postgres did not send it; set"
                        f" ALTER TABLE {relation.qualified} REPLICA IDENTITY FULL, then"
                        " 'sluice cdc drop' this pipeline, empty its sink table and discover"
                        " again (a new snapshot: the changes already in the slot were written"
                        " without the old row, every rerun would fail the same)"
                    )
                else:
                    values.append(None)  # not read by the pipeline
            else:
                try:
                    values.append(from_text(column.type_oid, text))
                except ValueError as exc:
                    raise CdcError(
                        f"table {relation.qualified}: column {column.name!r}: {exc};"
                        f" a change of {self._key} {self._key_text(relation, texts)} in the"
                        " slot holds it (fixing the row adds a change, this one stays): take"
                        " a new snapshot once no row holds such a value ('sluice cdc drop',"
                        " empty the sink, discover again)"
                    ) from None
        return values

    def _key_text(self, relation: Relation, texts: tuple[str | None, ...]) -> str:
        """The key's value in ``texts`` as the error shows it (its text, or "unknown")."""
        names = [c.name for c in relation.columns]
        text = texts[names.index(self._key)] if self._key in names else None
        return "unknown" if not isinstance(text, str) else repr(text[:40])

    @staticmethod
    def _before_json(relation: Relation, before: list[Any]) -> str:
        old = {
            c.name: v
            for c, v in zip(relation.columns, before, strict=True)
            if v is not None and v is not UNCHANGED
        }
        return orjson.dumps(old, default=json_default).decode()
