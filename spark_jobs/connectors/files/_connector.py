"""The files source connector: landing files (JSON Lines, CSV, gzip, Parquet) in ``dt=`` day
folders or directly in the landing folder, discovered by the file enumerators of
:mod:`enumerator_service` and read by :class:`FileSplitReader`."""

from __future__ import annotations

import dataclasses
import gzip
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any

from enumerator_service import (
    CHANGED_REASON,
    ConfigError,
    FileChangedError,
    FileDiscovery,
    FileSplit,
    LandingRoot,
    ObjectLanding,
    OutsideLandingError,
    OutsidePrefixError,
    Settings,
    check_uri,
    days_with_files,
    is_uri,
)
from spark_jobs.connectors._interface import (
    ObservedInput,
    ReaderContext,
    SourceConnector,
    SourceDetails,
    UpstreamAsset,
)
from spark_jobs.connectors.files._listing import list_landing
from spark_jobs.connectors.files._paths import landing_location, landing_path
from spark_jobs.connectors.files._reader import FileSplitReader
from spark_jobs.source._csv import CsvHeaderError
from spark_jobs.source._line_reader import LINE_KINDS, check_whole_file
from spark_jobs.source._parquet_reader import ParquetSplitError

if TYPE_CHECKING:
    from enumerator_service import Discovery
    from spark_jobs.pipeline._checks import Context
    from spark_jobs.pipeline._definition import Pipeline
    from spark_jobs.pipeline._plan import Plan, SourcePlan
    from spark_jobs.source._batch import RecordSchema
    from spark_jobs.source._records import BlockReader

__all__ = ["FilesConnector", "FilesOptions"]

# Content errors by type, each with the short reason kept in ``splits.failure_reason``. Order
# matters: the first matching type names the reason (CsvHeaderError is a ValueError).
_CONTENT_ERRORS: tuple[tuple[type[BaseException], str], ...] = (
    (FileChangedError, CHANGED_REASON),
    (CsvHeaderError, "bad CSV header"),
    (ParquetSplitError, "unreadable Parquet file"),
    (gzip.BadGzipFile, "corrupt gzip stream"),
    (EOFError, "truncated compressed stream"),
    (zlib.error, "corrupt compressed stream"),
    (OutsidePrefixError, "key outside the landing prefix"),
    (OutsideLandingError, "link leads out of the landing folder"),
    (FileNotFoundError, "file not found"),
    (IsADirectoryError, "not a file"),
    (PermissionError, "file not readable"),
    (UnicodeDecodeError, "undecodable content"),
    (ValueError, "unreadable content"),
)


@dataclass(frozen=True, slots=True)
class FilesOptions:
    """The validated landing folder as given (relative: under the data folder), a URI
    (``s3://bucket/prefix``, kept as a string), or None (the default folder)."""

    landing: Path | str | None


def _landing(given: object) -> Path | str:
    """An absolute folder, a relative one that stays under the data folder (no ``..``), or a
    URI (``file://``, ``s3://bucket/prefix``, ``gs://``, ``abfs://``, ``hdfs://``: kept as
    given, its form checked — a scheme Sluice does not know, credentials in it — without
    contacting anything)."""
    if not isinstance(given, str | Path) or not str(given) or "\x00" in str(given):
        raise ValueError(f"landing {given!r} is not a folder path")
    if isinstance(given, str) and "://" in given:
        try:
            check_uri(given, what="landing")
        except ConfigError as exc:
            raise ValueError(f"landing {given!r}: {exc.problem}") from None
        return given.rstrip("/")
    path = Path(given)
    if not path.is_absolute() and ".." in path.parts:
        raise ValueError(f"landing {str(given)!r} leads out of the data folder ('..')")
    return path


def _date(text: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise ValueError(f"start_date {text!r} is not YYYY-MM-DD") from None


class FilesConnector(SourceConnector):
    name = "files"
    split_kinds = (*LINE_KINDS, "parquet")

    def validate(self, spec: Any, ctx: Context) -> SourceDetails:
        if spec.partition_by not in ("day", None):
            raise ctx.fail(f"partition_by must be 'day' or None, got {spec.partition_by!r}")
        landing = None if spec.landing is None else ctx.check(_landing, spec.landing)
        start = spec.start_date
        if isinstance(start, str):
            start = ctx.check(_date, str(spec.start_date))
        if start is not None and not isinstance(start, date):
            raise ctx.fail(f"start_date must be a date or 'YYYY-MM-DD', got {start!r}")
        return SourceDetails(FilesOptions(landing), spec.partition_by == "day", start)

    def describe(self, plan: SourcePlan, pipeline: str, where: str | None = None) -> str:
        layout = "dt=YYYY-MM-DD folders" if plan.partitioned else "unpartitioned"
        given = plan.options.landing
        return f"files in {where or given or '<data>/landing/' + pipeline} ({layout})"

    def location(self, pipeline: Pipeline, settings: Settings) -> str | None:
        return landing_location(pipeline, settings).uri

    def sample_folder(self, pipeline: Pipeline, settings: Settings) -> Path | None:
        return landing_path(pipeline, settings)

    def discovery(self, pipeline: Pipeline, settings: Settings) -> Discovery:
        partitioned = pipeline.plan.source.partitioned
        landing = landing_location(pipeline, settings)
        where = landing if landing.object_store else landing.local_path
        return FileDiscovery(pipeline.name, where, partitioned)

    def waiting_for_input(self, pipeline: Pipeline, settings: Settings) -> str | None:
        # A prefix on an object store is never missing: one without objects yet is an empty
        # listing (its bucket is checked by discovery).
        landing = landing_location(pipeline, settings)
        if landing.object_store or landing.local_path.is_dir():
            return None
        return f"landing folder {landing.local_path} does not exist yet"

    def input_days(self, pipeline: Pipeline, settings: Settings) -> list[date] | None:
        landing = landing_location(pipeline, settings)
        return sorted(days_with_files(landing, follow_symlinks=settings.follow_symlinks))

    def reader_root(self, pipeline: Pipeline, settings: Settings) -> Any:
        # Tasks open landing files only inside it (links out of it: SLUICE_FOLLOW_SYMLINKS;
        # on an object store: keys inside its prefix).
        landing = landing_location(pipeline, settings)
        return landing.uri if landing.object_store else LandingRoot.of(landing.path).path

    def split_reader(self, schema: RecordSchema, context: ReaderContext) -> BlockReader:
        landing: LandingRoot | ObjectLanding | None = None
        if context.root is not None and is_uri(context.root):
            # The executor builds its own client (its own credential chain) from URI + options.
            landing = ObjectLanding.of(context.root, context.storage)
        elif context.root is not None:
            landing = LandingRoot(context.root, context.follow_symlinks)
        return FileSplitReader(
            schema,
            max_line_bytes=context.max_line_bytes,
            block_bytes=context.block_bytes,
            landing=landing,
        )

    def check_split(self, split: Any) -> None:
        if isinstance(split, FileSplit):
            check_whole_file(split)

    def replay_split(self, split: Any, start: int, end: int) -> Any:
        # Plain line files are cut to the range; gzip must be read from its start.
        if isinstance(split, FileSplit) and split.kind in ("jsonl", "csv"):
            return dataclasses.replace(split, start=start, end=end)
        return split

    def content_errors(self) -> Sequence[tuple[type[BaseException], str]]:
        return _CONTENT_ERRORS

    def upstream_assets(self, plan: Plan) -> list[UpstreamAsset]:
        partitioned = plan.source.partitioned

        def observe(pipeline: Pipeline, settings: Settings) -> tuple[str | None, Mapping[str, Any]]:
            landing = landing_location(pipeline, settings)
            listing = list_landing(landing, partitioned=partitioned)
            metadata: dict[str, Any] = {
                "path": landing.uri,
                "files": listing.files,
                "total_bytes": listing.total_bytes,
                "partitions": listing.partitions,
            }
            if listing.files:
                metadata["newest_mtime"] = listing.newest_mtime_ns / 1e9
            return listing.data_version, metadata

        return [
            ObservedInput(
                "landing",
                f"The files pipeline {plan.name} reads (its landing folder).",
                frozenset({"file"}),
                observe,
                path_key="path",
            )
        ]
