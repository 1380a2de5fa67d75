"""Generates reference/api/pipeline.md and reference/api/connectors.md (run by
mkdocs-gen-files): one mkdocstrings block per public name, grouped for reading. The names
come from ``__all__`` (``spark_jobs``, ``spark_jobs.connectors``, ``dagster_project``): a new
public name appears under "Other" until it is given a group here, never missing."""

from __future__ import annotations

import sys
from pathlib import Path

import mkdocs_gen_files

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import dagster_project
import spark_jobs
import spark_jobs.connectors

PIPELINE_GROUPS: dict[str, list[str]] = {
    "Pipeline": ["Pipeline", "SampleTarget", "claim_demo_table"],
    "Sources": ["FileSource", "TableSource", "KafkaSource"],
    "Steps": ["Lookup", "AsyncMap", "Map", "Filter"],
    "Lookup caches and misses": ["PartialCache", "FullCache", "RetryOnMiss"],
    "Async functions": [
        "AsyncFunction",
        "CoroutineAsyncFunction",
        "ResultFuture",
        "fixed_delay",
        "exponential_backoff",
        "EMPTY_RESULT",
        "HAS_EXCEPTION",
    ],
    "Sinks": ["ParquetSink", "PostgresSink", "DeltaSink", "IcebergSink"],
    "Errors and outcomes": [
        "PipelineDefinitionError",
        "DeterministicFailure",
        "DemoDataRefused",
        "ExitCode",
    ],
    "Spark": ["spark_for"],
}

#: enumerator_service names a pipeline module uses (examples/_clickstream_data.py).
SQL_NAMES = ["quote_identifier", "qualified_name"]

CONNECTOR_GROUPS: dict[str, list[str]] = {
    "Source connectors": [
        "SourceConnector",
        "SourceDetails",
        "ReaderContext",
        "ObservedInput",
        "TableInput",
        "UpstreamAsset",
    ],
    "Sink connectors": ["SinkConnector", "SinkDetails", "SinkWriterContext"],
    "Table maintenance": [
        "TableMaintenance",
        "CompactionResult",
        "ExpiryResult",
        "OrphanResult",
        "DEFAULT_RETENTION",
        "DEFAULT_GRACE",
        "sweep_orphans",
        "pending_files",
    ],
    "Registry": [
        "register_source",
        "register_sink",
        "ensure_registered",
        "registered_sources",
        "registered_sinks",
        "source_connector",
        "source_connector_named",
        "source_connector_for_split",
        "sink_connector",
        "sink_connector_named",
    ],
    "Validation": ["ValidationContext"],
    "Built-in specs": [
        "FileSource",
        "TableSource",
        "KafkaSource",
        "ParquetSink",
        "PostgresSink",
        "DeltaSink",
        "IcebergSink",
    ],
}


def _blocks(module: str, groups: dict[str, list[str]], public: list[str]) -> list[str]:
    seen = {name for names in groups.values() for name in names}
    unknown = sorted(set(seen) - set(public))
    if unknown:
        raise SystemExit(f"docs/_gen/api.py groups names {module} does not export: {unknown}")
    rest = [name for name in public if name not in seen]
    out = []
    for title, names in [*groups.items(), ("Other", rest)]:
        if not names:
            continue
        out.append(f"## {title}\n")
        out.extend(f"::: {module}.{name}\n" for name in names)
    return out


def pipeline_page() -> str:
    lines = [
        "# Pipeline API\n",
        "Everything a pipeline module imports: `from spark_jobs import Pipeline, FileSource, "
        "Lookup, ...`. Field types are written as in [Types](../types.md); durations are "
        "seconds or text such as `500ms`, `10s`, `5m`, `2h`. Options left `None` take the "
        "platform defaults ([Settings](../settings.md)) when a run opens.\n",
        "*This page is generated from the docstrings of `spark_jobs.__all__` and "
        "`dagster_project.__all__`.*\n",
    ]
    lines += _blocks("spark_jobs", PIPELINE_GROUPS, list(spark_jobs.__all__))
    lines.append("## Dagster\n")
    lines.append(
        "The code location (`dagster dev -m dagster_project.definitions`) builds one set of "
        "definitions per registered pipeline; a pipeline module's own assets join them "
        "with these.\n"
    )
    lines.append("::: dagster_project.definitions.defs\n")
    lines.extend(f"::: dagster_project.{name}\n" for name in dagster_project.__all__)
    lines.append("## SQL names\n")
    lines.append(
        "For a `sample_data` generator's own SQL (table and column names, quoted as Sluice "
        "quotes them).\n"
    )
    lines.extend(f"::: enumerator_service.{name}\n" for name in SQL_NAMES)
    return "\n".join(lines)


def connectors_page() -> str:
    lines = [
        "# Connector API\n",
        "The interface sources and sinks plug into Sluice with "
        "(`spark_jobs.connectors`); see "
        "[Writing a connector](../../contributing/writing-a-connector.md).\n",
        "*This page is generated from the docstrings of `spark_jobs.connectors.__all__`.*\n",
        "::: spark_jobs.connectors\n    options:\n      members: false\n      "
        "show_root_heading: false\n",
    ]
    lines += _blocks("spark_jobs.connectors", CONNECTOR_GROUPS, list(spark_jobs.connectors.__all__))
    return "\n".join(lines)


with mkdocs_gen_files.open("reference/api/pipeline.md", "w") as page:
    page.write(pipeline_page())
with mkdocs_gen_files.open("reference/api/connectors.md", "w") as page:
    page.write(connectors_page())
