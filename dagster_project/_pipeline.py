"""Discovery + enrichment shared by the partitioned asset and the incremental job."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dagster import MetadataValue

from enumerator_service import DiscoveryResult, Settings
from enumerator_service._operations import discover, open_platform

if TYPE_CHECKING:
    from spark_jobs.jobs import RunSummary

__all__ = ["describe", "discover_and_enrich", "discover_once", "summary_metadata"]


def discover_once(settings: Settings, dates: Sequence[date] | None = None) -> DiscoveryResult:
    """One discovery tick (bounded to ``dates`` when given) on a short-lived connection."""
    platform = open_platform(settings)
    try:
        return discover(platform, dates=dates)
    finally:
        platform.close()


def discover_and_enrich(
    settings: Settings, dates: Sequence[date] | None = None
) -> tuple[DiscoveryResult, RunSummary]:
    """Register the splits of ``dates`` (or all new files), then process every unassigned one."""
    discovery = discover_once(settings, dates)
    # Imported here so loading the code location (and every sensor tick) never imports PySpark.
    from spark_jobs.jobs import run_enrichment

    summary = run_enrichment(settings, dates=list(dates) if dates is not None else None)
    return discovery, summary


def describe(summary: RunSummary) -> str:
    """One log line for a finished run (no connection details)."""
    if summary.nothing_new:
        return f"run {summary.run_id}: nothing new to process"
    return (
        f"run {summary.run_id}: {summary.splits} splits, {summary.rows_in} rows in, "
        f"{summary.rows_out} rows out, {summary.dead_letters} dead letters, "
        f"{summary.fenced} fenced, {summary.seconds:.1f}s ({summary.rows_per_second:,.0f} rows/s)"
    )


def summary_metadata(
    discovery: DiscoveryResult, summary: RunSummary, output: Path
) -> dict[str, MetadataValue[Any]]:
    """Dagster metadata for a run: counts and the output folder, never the database URL."""
    return {
        "run_id": MetadataValue.text(summary.run_id),
        "files_seen": MetadataValue.int(discovery.files_seen),
        "splits_registered": MetadataValue.int(discovery.splits_registered),
        "splits": MetadataValue.int(summary.splits),
        "rows_in": MetadataValue.int(summary.rows_in),
        "rows_out": MetadataValue.int(summary.rows_out),
        "dead_letters": MetadataValue.int(summary.dead_letters),
        "fenced": MetadataValue.int(summary.fenced),
        "seconds": MetadataValue.float(float(summary.seconds)),
        "rows_per_second": MetadataValue.float(float(summary.rows_per_second)),
        "nothing_new": MetadataValue.bool(summary.nothing_new),
        "output_path": MetadataValue.path(str(output)),
    }
