"""Delta Lake: a table written with delta-rs, one commit per checkpoint — the ``DeltaSink``."""

from spark_jobs.connectors._registry import register_sink
from spark_jobs.connectors.delta._commit import SINK_NAME, DeltaCommitter, run_app_id
from spark_jobs.connectors.delta._connector import DeltaConnector
from spark_jobs.connectors.delta._maintenance import (
    DeltaMaintenance,
    compact_day,
    remove_orphans,
    vacuum,
)
from spark_jobs.connectors.delta._paths import DeltaOptions, delta_storage, table_location
from spark_jobs.connectors.delta._rebuild import rebuild_app_id
from spark_jobs.connectors.delta._spec import DeltaSink

__all__ = [
    "SINK_NAME",
    "DeltaCommitter",
    "DeltaConnector",
    "DeltaMaintenance",
    "DeltaOptions",
    "DeltaSink",
    "compact_day",
    "delta_storage",
    "rebuild_app_id",
    "remove_orphans",
    "run_app_id",
    "table_location",
    "vacuum",
]

register_sink(DeltaSink, DeltaConnector())
