"""Where a Delta sink's table is, and how delta-rs reaches it.

The table folder is ``DeltaSink.path``: a URI, an absolute folder, or a folder relative to
``SLUICE_WAREHOUSE_DIR`` — resolved exactly as ``ParquetSink.path`` is (one rule for every
file sink), as a :class:`~enumerator_service.Location`. delta-rs has its own object-store
client (Rust ``object_store``): :func:`delta_storage` gives it the table URI and the
non-secret settings (endpoint, region); it takes credentials from the standard AWS chain in
the process that opens the table, so no secret is ever passed, logged or pickled here.

Threading: pure functions, any thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from enumerator_service import Location, Settings, StorageOptions, open_location
from spark_jobs.connectors.parquet import output_root

if TYPE_CHECKING:
    from spark_jobs.pipeline._definition import Pipeline

__all__ = ["DeltaOptions", "delta_storage", "table_location", "table_uri"]


@dataclass(frozen=True, slots=True)
class DeltaOptions:
    """The validated ``DeltaSink`` values. ``path``: the table folder as given; ``folder``:
    unused (the attribute the shared path rule reads when no path is given);
    ``partition_by``: the partition column's name (used for a day-partitioned pipeline);
    ``pipeline``: its name (in the app ids of the table's commits)."""

    path: str
    partition_by: str | None
    compression: str
    pipeline: str
    folder: str = ""


def table_location(pipeline: Pipeline, settings: Settings) -> Location:
    """The table folder (a local folder or an object-store prefix); ConfigError naming the
    sink path when it cannot be used."""
    return output_root(pipeline, settings)


def table_uri(location: Location) -> str:
    """The URI delta-rs opens (and the key of the table's advisory lock)."""
    return location.uri if location.object_store else str(location.local_path)


def delta_storage(location: Location | StorageOptions | None) -> dict[str, str]:
    """delta-rs ``storage_options`` for ``location`` (or for object stores reached with
    these options): endpoint and region only. No locking provider and no "unsafe rename":
    delta-rs 1.x writes each log entry with a conditional put (S3 ``If-None-Match``), so a
    writer outside Sluice racing a commit gets a conflict, never a lost update (Sluice's own
    commits are serialised by ``table_lock`` besides)."""
    options = location.options if isinstance(location, Location) else location
    storage: dict[str, str] = {}
    if isinstance(location, Location) and location.scheme != "s3":
        return storage
    if options is None:
        return storage
    if options.s3_endpoint_url:
        storage["AWS_ENDPOINT_URL"] = options.s3_endpoint_url
        if urlsplit(options.s3_endpoint_url).scheme == "http":
            storage["AWS_ALLOW_HTTP"] = "true"
    if options.s3_region:
        storage["AWS_REGION"] = options.s3_region
    return storage


def reopen(uri: str, options: StorageOptions | None) -> Location:
    """The Location of a table URI kept in a staged entry (``table_uri`` form)."""
    return open_location(uri, options)
