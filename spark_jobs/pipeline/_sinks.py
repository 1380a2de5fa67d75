"""What a pipeline's ``sink`` is: the spec value of a registered sink connector
(``ParquetSink``, ``PostgresSink``, or one registered with
:func:`spark_jobs.connectors.register_sink`). Every sink is exactly-once: two-phase commit
with the checkpoint that covers the records."""

from __future__ import annotations

from typing import Any

__all__ = ["Sink"]

#: A sink spec: any value whose type is registered (checked when the pipeline is built).
Sink = Any
