"""Pipelines and oracle checks of the Kafka connector tests (reusable by fault and
benchmark tests): a clickstream pipeline over a topic, and the output read back."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds

from spark_jobs import KafkaSource, ParquetSink, Pipeline

__all__ = ["CLICK_SCHEMA", "assert_exactly_once", "click_pipeline", "output_rows"]

CLICK_SCHEMA = {
    "event_id": "string",
    "user_id": "int64",
    "event_type": "string",
    "ts": "timestamp",
    "kafka_partition": "int64",
    "kafka_offset": "int64",
}


def click_pipeline(name: str, bootstrap: str, **source: Any) -> Pipeline:
    """Clickstream events of ``topics`` (or ``pattern``) into a Parquet table by event day."""
    options: dict[str, Any] = {"event_time": "ts", "out_of_orderness": "1s"}
    options.update(source)
    return Pipeline(
        name=name,
        source=KafkaSource(
            bootstrap=bootstrap,
            schema=CLICK_SCHEMA,
            required=["event_id", "ts"],
            **options,
        ),
        sink=ParquetSink(name),
        key=["event_id"],
    )


def output_rows(folder: Path) -> list[dict[str, Any]]:
    """Every row of the Parquet table in ``folder`` (none when it does not exist yet)."""
    if not folder.exists() or not any(folder.rglob("*.parquet")):
        return []
    table = ds.dataset(folder, format="parquet", partitioning="hive").to_table()
    return table.to_pylist()


def assert_exactly_once(rows: list[dict[str, Any]], oracle: dict[str, dict[str, Any]]) -> None:
    """The output holds each produced event once, with its fields: duplicates 0, missing 0."""
    counts = Counter(r["event_id"] for r in rows)
    duplicates = sum(n - 1 for n in counts.values() if n > 1)
    missing = sorted(set(oracle) - set(counts))
    extra = sorted(set(counts) - set(oracle))
    assert (duplicates, len(missing), len(extra)) == (0, 0, 0), (
        f"duplicates {duplicates}, missing {len(missing)} {missing[:5]}, extra {extra[:5]}"
    )
    for row in rows:
        event = oracle[row["event_id"]]
        assert (row["user_id"], row["event_type"]) == (event["user_id"], event["event_type"])
