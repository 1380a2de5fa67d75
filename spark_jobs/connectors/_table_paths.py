"""The path rule of sinks that write a table folder (Parquet, Delta): what ``path=`` may be."""

from __future__ import annotations

from os import PathLike, fspath
from pathlib import PurePosixPath

from enumerator_service import ConfigError, open_location

__all__ = ["table_folder_path"]


def table_folder_path(given: object, bucket_root: str) -> str:
    """A table folder: a URI of a supported scheme (checked, never opened here), an absolute
    folder, or one relative to the warehouse root without ``..``. ``bucket_root``: the
    refusal of a bucket's root itself, after ``path <uri>: ``. ValueError otherwise."""
    if not isinstance(given, str | PathLike) or not fspath(given) or "\x00" in fspath(given):
        raise ValueError(f"path {given!r} is not a folder path or URI")
    text = fspath(given)
    if "://" in text:
        try:
            location = open_location(text, what="path")  # scheme, credentials, bucket
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        if location.object_store and "/" not in location.path.strip("/"):
            raise ValueError(f"path {location.uri}: {bucket_root}")
        return location.uri
    path = PurePosixPath(text)
    if not path.is_absolute() and ".." in path.parts:
        raise ValueError(f"path {text!r} leads out of the warehouse folder ('..')")
    return text
