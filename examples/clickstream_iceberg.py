"""The clickstream pipeline writing an Apache Iceberg table: the same landing folder
(``data/landing/events``), the same users lookup, output committed to the table
``analytics.clickstream_events`` of Sluice's catalog (one snapshot per completed checkpoint,
partitioned by ``day(event_time)``, a rebuilt day replaced in one overwrite snapshot).

The Parquet example (``examples.clickstream``) is untouched: this is a pipeline of its own,
with its own split source, so both may run over the same files. Its module adds the
``daily_revenue_by_country`` asset downstream of it (``dagster_assets``), which reads the
table by snapshot and refreshes itself when a day completes (``examples.clickstream_revenue``).
"""

from __future__ import annotations

import dataclasses

# The module, not the pipeline: every Pipeline at this module's top level is registered,
# and this one must register only clickstream_iceberg.
import examples.clickstream as _parquet_example
from spark_jobs import IcebergSink, Pipeline

__all__ = ["ICEBERG_TABLE", "clickstream_iceberg", "dagster_assets"]

#: ``namespace.name`` in Sluice's catalog: "analytics" groups the example tables; the name
#: says what the rows are (clickstream events), as ``enriched_events`` does for the Parquet one.
ICEBERG_TABLE = "analytics.clickstream_events"

clickstream_iceberg: Pipeline = dataclasses.replace(
    _parquet_example.clickstream,
    name="clickstream_iceberg",
    description="Web events enriched with their users, an Iceberg table by day.",
    sink=IcebergSink(ICEBERG_TABLE),
)


def dagster_assets() -> list[object]:
    """Assets downstream of this pipeline, for the Dagster code location (called when it
    loads, so the settings are read then)."""
    from enumerator_service import load_settings
    from examples.clickstream_revenue import daily_revenue_asset

    return [daily_revenue_asset(load_settings())]
