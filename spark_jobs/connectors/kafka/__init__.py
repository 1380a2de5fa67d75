"""Kafka: messages of topics, one split per topic-partition — the ``KafkaSource``."""

from spark_jobs.connectors._registry import register_source
from spark_jobs.connectors.kafka._connector import KafkaConnector, KafkaOffsetCommitter
from spark_jobs.connectors.kafka._enumerator import KafkaEnumerator
from spark_jobs.connectors.kafka._options import KafkaOptions
from spark_jobs.connectors.kafka._reader import KafkaSplitReader, PartitionGoneError
from spark_jobs.connectors.kafka._spec import KafkaSource

__all__ = [
    "KafkaConnector",
    "KafkaEnumerator",
    "KafkaOffsetCommitter",
    "KafkaOptions",
    "KafkaSource",
    "KafkaSplitReader",
    "PartitionGoneError",
]

register_source(KafkaSource, KafkaConnector())
