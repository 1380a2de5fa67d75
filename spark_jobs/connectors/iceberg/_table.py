"""An Iceberg sink's table before a run's tasks start: created from the pipeline's output
schema on first use, its partition spec checked, its schema evolved for added fields, and
the field ids the tasks write with published next to the data.

Partitioning: ``day(<event_time>)`` when the pipeline is day-partitioned by an event-time
field that is in the output and required (a record's output day is then the day of that
field, so the table's day partitions are exactly Sluice's days and a rebuilt day is one
partition); unpartitioned for a pipeline without partitions. Anything else is a one-line
``ConfigError`` naming the sink option, before the run starts.

Field ids: Spark tasks never open the catalog, so the ids of the output fields (by name)
are written by the driver to ``<data>/_sluice/field-ids.json`` (one small object: a single
PUT, whole or absent) and read by each writer when it opens; the committer checks every
data file's ids against the table's schema before adding it.

Threading: blocks on the catalog and the store; call from the driver.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.io.pyarrow import _ConvertToIcebergWithoutIDs, visit_pyarrow
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionField, PartitionSpec
from pyiceberg.schema import Schema, assign_fresh_schema_ids, promote
from pyiceberg.table import Table
from pyiceberg.transforms import DayTransform
from pyiceberg.types import IcebergType

from enumerator_service import ConfigError, Location, StorageOptions
from spark_jobs.connectors.iceberg._catalog import data_root, one_line, planned_location

__all__ = [
    "FIELD_IDS",
    "ensure_table",
    "expected_partition",
    "field_ids_location",
    "iceberg_schema",
    "read_field_ids",
    "with_field_ids",
]

#: Under the data folder: the output fields' ids (by name) for the tasks.
FIELD_IDS = ("_sluice", "field-ids.json")
_FIELD_ID = b"PARQUET:field_id"


def iceberg_schema(arrow: pa.Schema) -> Schema:
    """The Iceberg schema of an Arrow schema, field ids 1…n in order (all fields optional:
    Sluice's output fields are nullable)."""
    schema = visit_pyarrow(arrow, _ConvertToIcebergWithoutIDs())
    assert isinstance(schema, Schema)
    return assign_fresh_schema_ids(schema)


def expected_partition(
    pipeline: str, source: Any, outputs: Sequence[str], partition_by: str | None
) -> str | None:
    """The event-time field the table is partitioned by day on, or None (unpartitioned);
    ConfigError naming ``IcebergSink(partition_by)`` when the pipeline's partitions cannot
    be a table partition spec."""
    what = f"pipeline {pipeline}: IcebergSink(partition_by)"
    if not source.partitioned:
        if partition_by not in ("auto", None):
            raise ConfigError(what, f"{partition_by!r}, but the pipeline has no partitions")
        return None
    field = source.event_time
    if field is None:
        raise ConfigError(
            what,
            "the pipeline's days are landing days (no event_time field): an Iceberg table "
            "can only be partitioned by a field (declare the source's event_time)",
        )
    if partition_by is None or (partition_by != "auto" and partition_by != field):
        raise ConfigError(
            what, f"{partition_by!r} does not match the pipeline's partitions (day of {field!r})"
        )
    if field not in outputs:
        raise ConfigError(what, f"event-time field {field!r} is not in the output")
    if field not in source.required:
        raise ConfigError(what, f"event-time field {field!r} is nullable (make it required)")
    return str(field)


def _spec_for(schema: Schema, field: str | None) -> PartitionSpec:
    if field is None:
        return UNPARTITIONED_PARTITION_SPEC
    source_id = schema.find_field(field).field_id
    return PartitionSpec(
        PartitionField(
            source_id=source_id, field_id=1000, transform=DayTransform(), name=f"{field}_day"
        )
    )


def _spec_text(table: Table) -> str:
    schema = table.schema()
    parts = [f"{f.transform}({schema.find_column_name(f.source_id)})" for f in table.spec().fields]
    return ", ".join(parts) or "nothing (unpartitioned)"


def ensure_table(
    catalog: Catalog,
    identifier: str,
    outputs: pa.Schema,
    partition: str | None,
    *,
    what: str,
    storage: StorageOptions | None,
) -> Table:
    """The table, created or evolved for ``outputs`` (``partition``: the event-time field of
    a ``day()`` spec, or None); its field ids published for the tasks."""
    try:
        table = catalog.load_table(identifier)
    except NoSuchTableError:
        table = _create(catalog, identifier, outputs, partition, what=what)
    else:
        wanted = _spec_for(table.schema(), partition) if _has(table, partition) else None
        if wanted is None or [(f.source_id, str(f.transform)) for f in table.spec().fields] != [
            (f.source_id, str(f.transform)) for f in wanted.fields
        ]:
            shown = f"day({partition})" if partition else "nothing (unpartitioned)"
            raise ConfigError(
                f"{what}(partition_by)",
                f"table {identifier} is partitioned by {_spec_text(table)}, the pipeline "
                f"writes {shown}",
            )
        table = _evolve(table, identifier, outputs, what=what)
    _write_field_ids(table, storage)
    return table


def _has(table: Table, field: str | None) -> bool:
    return field is None or field in {f.name for f in table.schema().fields}


def _create(
    catalog: Catalog, identifier: str, outputs: pa.Schema, partition: str | None, *, what: str
) -> Table:
    namespace, name = identifier.split(".", 1)
    schema = iceberg_schema(outputs)
    try:
        catalog.create_namespace_if_not_exists(namespace)
        location = planned_location(catalog, namespace, name)
        return catalog.create_table(
            identifier,
            schema=schema,
            partition_spec=_spec_for(schema, partition),
            location=location,
        )
    except Exception as exc:
        raise ConfigError(
            what, f"cannot create Iceberg table {identifier}: {one_line(exc)}"
        ) from None


def _evolve(table: Table, identifier: str, outputs: pa.Schema, *, what: str) -> Table:
    """Add the output fields the table lacks and widen promotable types; a change Iceberg
    cannot make (a type that is no promotion, a required column the output lacks) fails."""
    current = table.schema()
    wanted = iceberg_schema(outputs)
    missing_required = [
        f.name for f in current.fields if f.required and f.name not in outputs.names
    ]
    if missing_required:
        raise ConfigError(
            f"{what}(table)",
            f"table {identifier} has required column(s) {', '.join(missing_required)} the "
            "output lacks",
        )
    added: list[tuple[str, IcebergType]] = []
    widened: list[tuple[str, IcebergType]] = []
    for field in wanted.fields:
        have = current.find_field(field.name) if field.name in current._name_to_id else None
        if have is None:
            added.append((field.name, field.field_type))
        elif have.field_type != field.field_type:
            if _promotes(field.field_type, have.field_type):
                continue  # written as the narrower type, read as the table's
            if not _promotes(have.field_type, field.field_type):
                raise ConfigError(
                    f"{what}(table)",
                    f"table {identifier} column {field.name!r} is {have.field_type}, the "
                    f"output's is {field.field_type} (not a type promotion)",
                )
            widened.append((field.name, field.field_type))
    if added or widened:
        with table.update_schema() as update:
            for name, kind in added:
                update.add_column(name, kind)
            for name, kind in widened:
                update.update_column(name, field_type=kind)
    return table


def _promotes(file_type: IcebergType, read_type: IcebergType) -> bool:
    try:
        promote(file_type, read_type)
    except Exception:  # ResolveError: not a promotion
        return False
    return True


def field_ids_location(data: Location) -> Location:
    return data.child(*FIELD_IDS)


def _write_field_ids(table: Table, storage: StorageOptions | None) -> None:
    # Every top-level column, not only this pipeline's: another pipeline writing the same
    # table (other fields) reads the same file.
    ids = {field.name: field.field_id for field in table.schema().fields}
    target = field_ids_location(data_root(table, storage))
    text = json.dumps(ids, sort_keys=True).encode()
    if target.object_store:
        with target.fs.open_output_stream(target.path) as out:
            out.write(text)
        return
    os.makedirs(os.path.dirname(target.path), exist_ok=True)
    temp = f"{target.path}.{os.getpid()}.tmp"
    with open(temp, "wb") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temp, target.path)


def read_field_ids(data: Location) -> dict[str, int]:
    """The field ids the driver published for the tasks (OSError when missing)."""
    target = field_ids_location(data)
    with target.fs.open_input_stream(target.path) as handle:
        ids: dict[str, int] = json.loads(bytes(handle.read()).decode())
    return ids


def with_field_ids(schema: pa.Schema, ids: dict[str, int]) -> pa.Schema:
    """``schema`` with each field's Iceberg id as ``PARQUET:field_id`` metadata."""
    missing = [name for name in schema.names if name not in ids]
    if missing:
        raise ValueError(f"iceberg sink: no field id for output field(s) {', '.join(missing)}")
    return pa.schema(
        [
            f.with_metadata({**(f.metadata or {}), _FIELD_ID: str(ids[f.name]).encode()})
            for f in schema
        ]
    )
