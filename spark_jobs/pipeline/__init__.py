"""The public pipeline definition API: sources, steps, sinks, and their validation.

```python
from spark_jobs import FileSource, Filter, Lookup, Map, ParquetSink, Pipeline
```
"""

from spark_jobs._url_env import database_note
from spark_jobs._url_env import named_engine as url_env_engine
from spark_jobs.async_io import (
    EMPTY_RESULT,
    HAS_EXCEPTION,
    AsyncFunction,
    CoroutineAsyncFunction,
    ResultFuture,
    exponential_backoff,
    fixed_delay,
)
from spark_jobs.connectors import (
    DeltaSink,
    FileSource,
    IcebergSink,
    KafkaSource,
    ParquetSink,
    PostgresCdcSource,
    PostgresSink,
    TableSource,
)
from spark_jobs.pipeline._definition import Pipeline
from spark_jobs.pipeline._demo_marks import DemoDataRefused, claim_demo_table
from spark_jobs.pipeline._errors import PipelineDefinitionError
from spark_jobs.pipeline._paths import discovery_of, warehouse_root
from spark_jobs.pipeline._plan import Column, Plan
from spark_jobs.pipeline._registry import load_pipelines
from spark_jobs.pipeline._sample import SampleTarget
from spark_jobs.pipeline._sinks import Sink
from spark_jobs.pipeline._sources import LatePolicy, Source
from spark_jobs.pipeline._steps import (
    AsyncMap,
    Filter,
    FullCache,
    Lookup,
    Map,
    PartialCache,
    RetryOnMiss,
    Step,
)
from spark_jobs.pipeline._types import Duration

__all__ = [
    "EMPTY_RESULT",
    "HAS_EXCEPTION",
    "AsyncFunction",
    "AsyncMap",
    "Column",
    "CoroutineAsyncFunction",
    "DeltaSink",
    "DemoDataRefused",
    "Duration",
    "FileSource",
    "Filter",
    "FullCache",
    "IcebergSink",
    "KafkaSource",
    "LatePolicy",
    "Lookup",
    "Map",
    "ParquetSink",
    "PartialCache",
    "Pipeline",
    "PipelineDefinitionError",
    "Plan",
    "PostgresCdcSource",
    "PostgresSink",
    "ResultFuture",
    "RetryOnMiss",
    "SampleTarget",
    "Sink",
    "Source",
    "Step",
    "TableSource",
    "claim_demo_table",
    "database_note",
    "discovery_of",
    "exponential_backoff",
    "fixed_delay",
    "load_pipelines",
    "url_env_engine",
    "warehouse_root",
]
