"""Files: landing files in a folder (JSON Lines, CSV, gzip, Parquet) — the ``FileSource``."""

from spark_jobs.connectors._registry import register_source
from spark_jobs.connectors.files._connector import FilesConnector, FilesOptions
from spark_jobs.connectors.files._listing import LandingListing, list_landing
from spark_jobs.connectors.files._paths import landing_location, landing_path
from spark_jobs.connectors.files._reader import FileSplitReader
from spark_jobs.connectors.files._spec import FileSource

__all__ = [
    "FileSource",
    "FileSplitReader",
    "FilesConnector",
    "FilesOptions",
    "LandingListing",
    "landing_location",
    "landing_path",
    "list_landing",
]

register_source(FileSource, FilesConnector())
