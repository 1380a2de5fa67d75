"""What each asset check of a pipeline finds for a partition, apart from how it is reported.

The checks (``checks.py``) report these outcomes from a run: launched with a materialisation,
alone from the UI, or requested by the completion reporter for a partition it reported
complete (``completions.py``). Kept apart from the Dagster wiring so that one code path decides
pass or fail whoever asks (the live-state sensor's freshness check is the same shape).

Each function here opens and closes its own database connections and touches no Dagster
state: safe to call from a sensor tick or from a step, on any thread.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import date
from typing import Any

from dagster import AssetCheckResult, AssetCheckSeverity, MetadataValue

from dagster_project._counts import PartitionCounts, partition_counts
from enumerator_service import Settings, connect_engine, database_url, quarantined
from spark_jobs.connectors import sink_connector_named, source_connector_named
from spark_jobs.pipeline import Pipeline

__all__ = ["CHECK_DESCRIPTIONS", "SAMPLE_KEYS", "Outcomes", "check_names", "outcomes_of"]

#: Duplicated keys listed in a failed check's metadata.
SAMPLE_KEYS = 5
#: The outcome of each asked-for partition (``None``: an unpartitioned output, whole).
Outcomes = Callable[[list[date | None]], dict[date | None, AssetCheckResult]]

CHECK_DESCRIPTIONS = {
    "unique_key": "No key ({keys}) appears twice in a partition.",
    "rows_reconcile": "Rows out == rows committed, and every split completed.",
    "dead_letter_ratio": "Dead letters are at most max_dead_letter_ratio of the records.",
    "no_quarantined_splits": "No split is quarantined (a poison file failing its reads).",
    "source_health": "What the source holds on a server is within bounds (a CDC source's "
    "replication slot retains at most SLUICE_CDC_MAX_RETAINED_WAL_MB of WAL).",
}


def check_names(pipeline: Pipeline) -> list[str]:
    """The checks a pipeline has (``unique_key`` only when it declares a key,
    ``source_health`` only when its source connector has a check of its own)."""
    names = ["rows_reconcile", "dead_letter_ratio", "no_quarantined_splits"]
    if source_connector_named(pipeline.plan.source.kind).health_description(pipeline.plan):
        names.append("source_health")
    return ["unique_key", *names] if pipeline.plan.key else names


def _label(day: date | None) -> str:
    return "the output" if day is None else str(day)


def _duplicates(pipeline: Pipeline, settings: Settings, day: date | None) -> tuple[int, list[str]]:
    """(duplicate rows, sample keys) of the key in one partition."""
    connector = sink_connector_named(pipeline.plan.sink.kind)
    return connector.duplicate_keys(pipeline, settings, day, list(pipeline.plan.key or ()))


def _rows_reconcile(c: PartitionCounts) -> AssetCheckResult:
    description = None
    if not c.reconciles:
        description = f"{_label(c.day)}: {c.rows_out} rows out, {c.rows_committed} committed"
        if c.splits_completed != c.splits:
            description += f", {c.splits - c.splits_completed} of {c.splits} splits not completed"
    metadata: dict[str, Any] = {
        "rows_out": MetadataValue.int(c.rows_out),
        "rows_committed": MetadataValue.int(c.rows_committed),
        "dead_letters": MetadataValue.int(c.dead_letters),
        "splits": MetadataValue.int(c.splits),
        "splits_completed": MetadataValue.int(c.splits_completed),
    }
    if not c.comparable:
        metadata["note"] = MetadataValue.text("upsert sink: rows merge by key")
    return AssetCheckResult(passed=c.reconciles, metadata=metadata, description=description)


def _dead_letter_ratio(c: PartitionCounts, limit: float) -> AssetCheckResult:
    failed = c.dead_letter_ratio > limit
    return AssetCheckResult(
        passed=not failed,
        severity=AssetCheckSeverity.WARN,
        metadata={
            "max_dead_letter_ratio": MetadataValue.float(limit),
            "dead_letter_ratio": MetadataValue.float(c.dead_letter_ratio),
            "dead_letters": MetadataValue.int(c.dead_letters),
            "rows_in": MetadataValue.int(c.rows_in),
        },
        description=(
            f"{_label(c.day)}: {c.dead_letter_ratio:.2%} dead letters (limit {limit:.2%})"
            if failed
            else None
        ),
    )


def _unique_key(
    pipeline: Pipeline, settings: Settings, days: list[date | None]
) -> dict[date | None, AssetCheckResult]:
    found: dict[date | None, AssetCheckResult] = {}
    for day in days:
        duplicates, sample = _duplicates(pipeline, settings, day)
        metadata: Mapping[str, Any] = {"duplicate_rows": MetadataValue.int(duplicates)}
        if sample:
            metadata = {**metadata, "sample_keys": MetadataValue.text(", ".join(sample))}
        found[day] = AssetCheckResult(
            passed=duplicates == 0,
            metadata=dict(metadata),
            description=f"{_label(day)}: {duplicates} duplicate rows" if duplicates else None,
        )
    return found


def _no_quarantined_splits(
    pipeline: Pipeline, settings: Settings, days: list[date | None]
) -> dict[date | None, AssetCheckResult]:
    engine = connect_engine(database_url(settings), pool_size=1)
    try:
        wanted = None if days == [None] else [d for d in days if d is not None]
        failed = quarantined(engine, pipeline.name, days=wanted)
    finally:
        engine.dispose()
    found: dict[date | None, AssetCheckResult] = {}
    for day in days:
        mine = [s for s in failed if day is None or s.partition_key == day]
        metadata: dict[str, Any] = {"quarantined_splits": MetadataValue.int(len(mine))}
        if mine:
            metadata["files"] = MetadataValue.md(
                "\n".join(f"- split {s.id}: {s.line()}" for s in mine[:50])
            )
        found[day] = AssetCheckResult(
            passed=not mine,
            metadata=metadata,
            description=(
                f"{_label(day)}: {len(mine)} quarantined splits "
                f"({', '.join(sorted({s.reason for s in mine}))}); "
                "fix the files, then sluice retry --all-failed"
                if mine
                else None
            ),
        )
    return found


def _source_health(
    pipeline: Pipeline, settings: Settings, days: list[date | None]
) -> dict[date | None, AssetCheckResult]:
    """The source connector's own check (one outcome, the same for every day asked)."""
    connector = source_connector_named(pipeline.plan.source.kind)
    engine = connect_engine(database_url(settings), pool_size=1)
    try:
        with engine.connect() as conn:
            passed, line, values = connector.health(conn, pipeline.plan, settings)
    finally:
        engine.dispose()
    metadata = {name: MetadataValue.text(str(value)) for name, value in values.items()}
    outcome = AssetCheckResult(passed=passed, metadata=metadata, description=line)
    return dict.fromkeys(days, outcome)


def outcomes_of(
    pipeline: Pipeline, settings: Settings, name: str, max_dead_letter_ratio: float
) -> Outcomes:
    """The outcomes of check ``name`` of ``pipeline`` (one of :func:`check_names`)."""

    def counted(make: Callable[[PartitionCounts], AssetCheckResult]) -> Outcomes:
        return lambda days: {c.day: make(c) for c in partition_counts(pipeline, settings, days)}

    if name == "rows_reconcile":
        return counted(_rows_reconcile)
    if name == "dead_letter_ratio":
        return counted(lambda c: _dead_letter_ratio(c, max_dead_letter_ratio))
    if name == "unique_key":
        return lambda days: _unique_key(pipeline, settings, days)
    if name == "no_quarantined_splits":
        return lambda days: _no_quarantined_splits(pipeline, settings, days)
    if name == "source_health":
        return lambda days: _source_health(pipeline, settings, days)
    raise ValueError(f"no check {name!r}")
