"""Dynamic partitions of a pipeline's output kept in step with what was discovered.

With ``SLUICE_DAGSTER_PARTITIONS=discovered`` (the default) the output's partitions are the
days that have input or output: the ``dt=`` folders of the landing folder that hold a data
file (so a day can be launched or backfilled before anything registered its files), every
``partition_key`` of the pipeline's splits (whoever registered them: a sensor, ``sluice
discover``, a run's own discovery) and every completed day (an event day may have no landing
folder of its own). :func:`sync_partitions` adds to Dagster the days it does not know yet, in
date order within one call (Dagster orders dynamic partitions by when they were added, so a
day discovered after a later one is listed after it); it never removes one.

Called by ``<pipeline>_report_completions`` before it reports (a completed day must exist as
a partition before its materialisation shows in the partition status). Opens its own
connections; runs on the sensor thread. Each call reads the distinct days of the source's
splits (an index scan of ``(source, status, partition_key)``): fine for thousands of days;
a cursor of the days already synced would bound it for sources with millions of splits.
"""

from __future__ import annotations

import sqlalchemy as sa
from dagster import DagsterInstance, DynamicPartitionsDefinition, PartitionsDefinition

from enumerator_service._completions import completions_table_exists, partition_completions
from enumerator_service._object_landing import days_with_files
from enumerator_service._schema import splits
from enumerator_service._storage import Location

__all__ = ["sync_partitions"]


def sync_partitions(
    instance: DagsterInstance,
    partitions: PartitionsDefinition | None,
    engine: sa.Engine,
    source: str,
    landing: Location | None = None,
    follow_symlinks: bool = False,
) -> list[str]:
    """Add ``source``'s days that Dagster does not have to ``partitions`` (dynamic ones
    only: a daily or no partitioning has nothing to add); the keys added. ``landing``: a
    file source's landing folder, whose days with data files count too."""
    if not isinstance(partitions, DynamicPartitionsDefinition) or partitions.name is None:
        return []
    query: sa.Select[tuple[object]] | sa.CompoundSelect[tuple[object]] = (
        sa.select(splits.c.partition_key)
        .where(splits.c.source == source, splits.c.partition_key.is_not(None))
        .distinct()
    )
    if completions_table_exists(engine):
        query = sa.union(
            query,
            sa.select(partition_completions.c.partition_key).where(
                partition_completions.c.source == source
            ),
        )
    with engine.connect() as conn:
        days = {str(day) for day in conn.execute(query).scalars()}
    if landing is not None:
        days |= {str(day) for day in days_with_files(landing, follow_symlinks=follow_symlinks)}
    known = set(instance.get_dynamic_partitions(partitions.name))
    new = sorted(days - known)
    if new:
        instance.add_dynamic_partitions(partitions.name, new)
    return new
