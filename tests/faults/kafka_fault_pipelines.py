"""The Kafka fault case's pipeline (the module named in ``SLUICE_PIPELINES`` by
``test_kafka_faults.py``; importable as ``tests.faults.kafka_fault_pipelines`` with the
repository and ``tests/`` on ``PYTHONPATH``).

``kafka_clicks``: the connector tests' clickstream pipeline (``tests/kafka_pipeline.py``: the
real ``KafkaSource`` into the real ``ParquetSink``, partitioned by event day) over the topic
``TOPIC`` of the broker ``SLUICE_TEST_KAFKA_BOOTSTRAP`` names (the test's Tansu broker).
No product code knows.
"""

from __future__ import annotations

import os

from kafka_pipeline import click_pipeline

__all__ = ["BOOTSTRAP_SETTING", "TOPIC", "kafka_clicks"]

#: The broker's ``host:port`` (set by the test; a closed port otherwise).
BOOTSTRAP_SETTING = "SLUICE_TEST_KAFKA_BOOTSTRAP"
TOPIC = "clicks_faults"

kafka_clicks = click_pipeline(
    "kafka_clicks", os.environ.get(BOOTSTRAP_SETTING, "127.0.0.1:9"), topics=[TOPIC]
)
