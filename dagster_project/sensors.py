"""The sensor that registers new landing files and asks for an incremental run."""

import hashlib

from dagster import (
    DefaultSensorStatus,
    RunRequest,
    SensorEvaluationContext,
    SkipReason,
    sensor,
)

from dagster_project._pipeline import discover_once
from dagster_project.jobs import process_new_splits_job
from dagster_project.resources import SluiceResource
from enumerator_service import DiscoveryResult

__all__ = ["discovery_run_key", "new_files_sensor"]


def discovery_run_key(source: str, discovery: DiscoveryResult, sequence: int) -> str:
    """A run key from the discovery cursor (mtime watermark, recent paths) and the new count.

    ``sequence`` (the sensor's own count of requested runs, kept in its Dagster cursor) keeps
    keys unique if the platform database is reset while the Dagster instance is kept: the same
    files would otherwise give the same key again and Dagster would silently drop the run.
    """
    watermark = discovery.cursor.get("mtime_watermark")
    recent = sorted(str(p) for p in discovery.cursor.get("recent_paths") or [])
    digest = hashlib.sha256("\n".join(recent).encode()).hexdigest()[:12]
    mark = f"{float(watermark):.6f}" if watermark is not None else "none"
    return f"{source}:{sequence}:{mark}:{digest}:{discovery.splits_registered}"


@sensor(
    job=process_new_splits_job,
    minimum_interval_seconds=30,
    default_status=DefaultSensorStatus.STOPPED,
)
def new_files_sensor(
    context: SensorEvaluationContext, sluice: SluiceResource
) -> RunRequest | SkipReason:
    """Each tick registers new landing files as splits; new splits -> one incremental run."""
    settings = sluice.settings()
    discovery = discover_once(settings)
    if discovery.splits_registered == 0:
        return SkipReason(f"no new files ({discovery.files_seen} files seen)")
    sequence = int(context.cursor or 0) + 1
    context.update_cursor(str(sequence))
    return RunRequest(
        run_key=discovery_run_key(settings.source_name, discovery, sequence),
        tags={
            "sluice/source": settings.source_name,
            "sluice/splits_registered": str(discovery.splits_registered),
        },
    )
