"""Delta Lake: a table written with delta-rs, one commit per checkpoint — the ``DeltaSink``."""

from spark_jobs.connectors._registry import register_sink
from spark_jobs.connectors.delta._commit import SINK_NAME, DeltaCommitter, run_app_id
from spark_jobs.connectors.delta._connector import DeltaConnector
from spark_jobs.connectors.delta._paths import DeltaOptions, delta_storage, table_location
from spark_jobs.connectors.delta._rebuild import rebuild_app_id
from spark_jobs.connectors.delta._spec import DeltaSink

__all__ = [
    "SINK_NAME",
    "DeltaCommitter",
    "DeltaConnector",
    "DeltaOptions",
    "DeltaSink",
    "delta_storage",
    "rebuild_app_id",
    "run_app_id",
    "table_location",
]

register_sink(DeltaSink, DeltaConnector())
