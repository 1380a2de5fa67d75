"""Dagster definitions built from the registered pipelines: an asset factory per pipeline
(``pipeline_definitions``), and what a pipeline module's own assets need to join them."""

from dagster_project._factory import PipelineDefinitions, pipeline_definitions
from dagster_project.assets import partition_days, partitions_of
from dagster_project.resources import SluiceResource
from spark_jobs.connectors.parquet import parquet_files, parquet_objects

__all__ = [
    "PipelineDefinitions",
    "SluiceResource",
    "parquet_files",
    "parquet_objects",
    "partition_days",
    "partitions_of",
    "pipeline_definitions",
]
