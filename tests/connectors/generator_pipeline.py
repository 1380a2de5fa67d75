"""Pipelines on the test-only generator source (the module named in ``SLUICE_PIPELINES``).

- ``generated``: 2 days x 1000 generated events → ``amount_cents`` (Map) → the events that
  are not views (Filter) → Parquet by day (``<warehouse>/generated/dt=YYYY-MM-DD``), key
  ``event_id``;
- ``generated_paced``: the same over 2 x 2000 events in splits of 1000, each reader paced at
  100 events/s (a run reads for about 20 s: it is killed after a checkpoint committed part
  of a split).

The connector lives in its own module (:mod:`tests.connectors.generator`): this module's
Map function is shipped to the Spark workers by value, a connector module must be imported
there by reference (importing it registers the connector).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs import Filter, Map, ParquetSink, Pipeline
from tests.connectors.generator import GeneratorSource

__all__ = ["FIRST_DAY", "add_amount_cents", "generated", "generated_paced"]

FIRST_DAY = "2026-05-01"


def add_amount_cents(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``amount_cents``: the amount in cents (an integer)."""
    cents = pc.round(pc.multiply(batch.column("amount"), 100.0))
    return batch.append_column("amount_cents", cents.cast(pa.int64()))


def _pipeline(name: str, source: GeneratorSource) -> Pipeline:
    return Pipeline(
        name=name,
        description="Generated events that are not views, with their amount in cents.",
        source=source,
        steps=[
            Map(add_amount_cents, output={"amount_cents": "int64"}),
            Filter(pc.field("event_type") != "view"),
        ],
        sink=ParquetSink(),
        key=["event_id"],
    )


generated = _pipeline("generated", GeneratorSource(first_day=FIRST_DAY, days=2, per_day=1000))
generated_paced = _pipeline(
    "generated_paced",
    GeneratorSource(first_day=FIRST_DAY, days=2, per_day=2000, per_split=1000, rows_per_second=100),
)
