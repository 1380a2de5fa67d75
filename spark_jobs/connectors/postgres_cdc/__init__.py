"""Postgres change data capture: a snapshot of tables in key-range chunks, then their
changes from a logical replication slot (``pgoutput``) — the ``PostgresCdcSource``."""

from spark_jobs.connectors._registry import register_source
from spark_jobs.connectors.postgres_cdc._connector import CdcConnector, CdcOptions
from spark_jobs.connectors.postgres_cdc._publication import PublicationMissingError
from spark_jobs.connectors.postgres_cdc._slot import (
    SlotInfo,
    SlotMissingError,
    drop_slot,
    slot_info,
)
from spark_jobs.connectors.postgres_cdc._spec import CDC_FIELDS, PostgresCdcSource

__all__ = [
    "CDC_FIELDS",
    "CdcConnector",
    "CdcOptions",
    "PostgresCdcSource",
    "PublicationMissingError",
    "SlotInfo",
    "SlotMissingError",
    "drop_slot",
    "slot_info",
]

register_source(PostgresCdcSource, CdcConnector())
