"""A reader subtask's configuration: plain values, so Spark can ship it to the workers."""

from __future__ import annotations

from dataclasses import dataclass

from spark_jobs.sink import SINK_NAME

__all__ = ["TaskConfig"]


@dataclass(frozen=True, slots=True)
class TaskConfig:
    """Everything a subtask needs; plain values so Spark can ship it to workers."""

    database_url: str
    asyncpg_dsn: str
    run_id: str
    lease_seconds: float
    output_root: str
    staging_root: str
    lookup_schema: str
    lookup_table: str
    lookup_key: str
    capacity: int
    batch_size: int
    pool_size: int
    max_line_bytes: int
    #: JSON Lines are read and parsed in blocks of about this many bytes (operator elements).
    block_bytes: int = 256 << 10
    timeout_seconds: float = 30.0
    retries: int = 3
    max_linger_ms: float = 0.0
    cache_rows: int = 0
    cache_ttl_seconds: float = 300.0
    #: Benchmarks only: slept per lookup round trip while holding the connection.
    injected_latency_ms: float = 0.0
    exactly_once: bool = True
    checkpoint_poll_seconds: float = 1.0
    #: A continuous subtask keeps asking for splits; it ends after ``continuous_idle_seconds``
    #: without one (None: only when cancelled).
    continuous: bool = False
    continuous_poll_seconds: float = 1.0
    continuous_idle_seconds: float | None = None
    debug: bool = False
    #: "parquet" (files under output_root) or "postgres" (rows in sink_schema.sink_table).
    sink: str = SINK_NAME
    sink_schema: str = "public"
    sink_table: str = ""
