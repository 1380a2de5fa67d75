"""The CLI's tables print users' names, patterns and reasons literally (no rich markup)."""

from __future__ import annotations

from rich.console import Console

from spark_jobs import ParquetSink, Pipeline
from spark_jobs.cli._render import describe_table
from spark_jobs.connectors.kafka import KafkaSource


def test_a_topic_pattern_with_brackets_is_shown_as_written() -> None:
    pipeline = Pipeline(
        name="payments",
        source=KafkaSource(
            bootstrap="127.0.0.1:9",
            pattern="payments(-[a-z]+)?",
            schema={"payment_id": "string", "paid_at": "timestamp"},
            event_time="paid_at",
        ),
        sink=ParquetSink("payments"),
    )
    console = Console(record=True, width=200)
    console.print(describe_table(pipeline, None, None, None))
    assert "'payments(-[a-z]+)?'" in console.export_text()
