"""The Delta table itself: created on first use, checked (and evolved) before a run.

:func:`ensure_table` runs before any task starts (``DeltaConnector.prepare``): a missing
table is created from the pipeline's output schema plus the partition column; an existing
one must be partitioned the same way, and every output field it has must have the same
Delta type. An output field the table lacks is added as a nullable column (a pipeline that
adds a field); a table column the output lacks stays (its value is null in new files).
Anything else is one ``ConfigError`` line naming the sink, before the run starts.

delta-rs errors carry a Rust backtrace after their first line; :func:`first_line` keeps
what people read.

Threading: blocking file-system calls; the driver's or a CLI thread.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
from deltalake import DeltaTable, Field
from deltalake import Schema as DeltaSchema
from deltalake.exceptions import DeltaError, TableNotFoundError

from enumerator_service import ConfigError
from spark_jobs.connectors._upsert_key import (
    UPSERT_KEY_PROPERTY,
    check_recorded_key,
    recorded_value,
)

__all__ = [
    "add_actions",
    "ensure_table",
    "first_line",
    "live_paths",
    "load_table",
    "record_upsert_key",
    "table_schema",
]


def first_line(exc: BaseException) -> str:
    """The message of a delta-rs error without its backtrace."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def load_table(uri: str, storage: dict[str, str]) -> DeltaTable | None:
    """The table at ``uri`` (its latest version), or None when there is none yet."""
    try:
        return DeltaTable(uri, storage_options=storage or None)
    except TableNotFoundError:
        return None


def table_schema(output: pa.Schema, partition: str | None) -> pa.Schema:
    """The table's Arrow schema: the output fields, then the partition column (``date``)."""
    if partition is None:
        return output
    return output.append(pa.field(partition, pa.date32()))


def _delta_types(schema: pa.Schema, what: str) -> dict[str, str]:
    try:
        converted = DeltaSchema.from_arrow(schema)
    except Exception as exc:  # delta-rs raises a bare Exception for unsupported types
        raise ConfigError(
            what, f"the output has a type Delta cannot store ({first_line(exc)})"
        ) from None
    return {field.name: _type_name(field.type) for field in converted.fields}


def _type_name(kind: object) -> str:
    """A Delta type as people read it (``long``, ``decimal(10,2)``; nested: its JSON)."""
    name = getattr(kind, "type", None)
    return name if isinstance(name, str) else str(kind)


def ensure_table(
    uri: str, storage: dict[str, str], schema: pa.Schema, partition: str | None, what: str
) -> None:
    """Create the table at ``uri`` with ``schema`` (``table_schema``), partitioned by
    ``partition``, or check and evolve the existing one; ConfigError(``what``, …)."""
    wanted = _delta_types(schema, what)
    try:
        table = load_table(uri, storage)
        if table is None:
            DeltaTable.create(
                uri,
                DeltaSchema.from_arrow(schema),
                mode="ignore",  # a concurrent creator of the same table: both end with it
                partition_by=[partition] if partition else None,
                storage_options=storage or None,
            )
            return
    except (DeltaError, OSError) as exc:
        raise ConfigError(what, f"{uri}: {first_line(exc)}") from None
    partitions = list(table.metadata().partition_columns)
    if partitions != ([partition] if partition else []):
        shown = ", ".join(partitions) or "nothing"
        expected = partition or "nothing (an unpartitioned pipeline)"
        raise ConfigError(what, f"{uri} is partitioned by {shown}, the pipeline needs {expected}")
    have = {field.name: _type_name(field.type) for field in table.schema().fields}
    clashes = [
        f"{name} is {have[name]} in the table, {kind} in the output"
        for name, kind in wanted.items()
        if name in have and have[name] != kind
    ]
    if clashes:
        raise ConfigError(what, f"the table does not fit the output: {'; '.join(clashes)}")
    added = [name for name in wanted if name not in have]
    if added:
        new = DeltaSchema.from_arrow(pa.schema([schema.field(name) for name in added]))
        try:
            table.alter.add_columns([Field(f.name, f.type, nullable=True) for f in new.fields])
        except (DeltaError, OSError) as exc:
            raise ConfigError(
                what, f"{uri}: adding {', '.join(added)}: {first_line(exc)}"
            ) from None


def add_actions(table: DeltaTable) -> pa.Table:
    """The current version's add actions (``path``, ``num_records``, ``partition.<col>``, …)."""
    return pa.table(table.get_add_actions(flatten=True))


def live_paths(table: DeltaTable) -> set[str]:
    """The data files of the current version, relative to the table folder."""
    return set(add_actions(table).column("path").to_pylist())


def record_upsert_key(
    uri: str, storage: dict[str, str], key: Sequence[str] | None, what: str
) -> None:
    """The table's recorded upsert key (``_upsert_key``): checked, or recorded when it has
    none yet (one metadata commit)."""
    table = load_table(uri, storage)
    if table is None:
        return
    recorded = table.metadata().configuration.get(UPSERT_KEY_PROPERTY)
    if check_recorded_key(recorded, key, uri, what):
        try:
            table.alter.set_table_properties(
                {UPSERT_KEY_PROPERTY: recorded_value(key)}, raise_if_not_exists=False
            )
        except (DeltaError, OSError) as exc:
            raise ConfigError(what, f"{uri}: recording the upsert key: {first_line(exc)}") from None
