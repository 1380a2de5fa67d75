"""One listing of a landing folder, aggregated (the Dagster observation of the input)."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from enumerator_service import PARTITION_DIR as _PARTITION_DIR
from enumerator_service import Location, ObjectLanding
from enumerator_service import kind_of as _kind_of

__all__ = ["LandingListing", "list_landing"]


@dataclass(frozen=True, slots=True)
class LandingListing:
    """Aggregates of one listing of a landing folder."""

    files: int
    total_bytes: int
    newest_mtime_ns: int
    partitions: int

    @property
    def data_version(self) -> str:
        key = f"{self.files}:{self.total_bytes}:{self.newest_mtime_ns}"
        return hashlib.sha256(key.encode()).hexdigest()[:16]


def list_landing(landing: Path | Location, *, partitioned: bool = True) -> LandingListing:
    """Count the data files the enumerators would register (same folder and name rules)."""
    files = total = newest = partitions = 0
    if isinstance(landing, Location) and landing.object_store:
        days = set()
        for _uri, _kind, day, identity in ObjectLanding(landing).data_files(
            partitioned=partitioned, dates=None
        ):
            files += 1
            total += identity.size
            newest = max(newest, identity.mtime_ns)
            days.add(day)
        return LandingListing(files, total, newest, len(days) if partitioned else 0)
    if isinstance(landing, Location):
        landing = landing.local_path
    if not landing.is_dir():
        return LandingListing(0, 0, 0, 0)
    folders = [landing]
    if partitioned:
        folders = [f for f in landing.iterdir() if _PARTITION_DIR.match(f.name) and f.is_dir()]
    for folder in folders:
        partitions += partitioned
        with os.scandir(folder) as entries:
            for entry in entries:
                # Hidden and "_" files are in-flight writes or markers, never data.
                if entry.name.startswith((".", "_")) or _kind_of(entry.name) is None:
                    continue
                if not entry.is_file():
                    continue
                stat = entry.stat()
                files += 1
                total += stat.st_size
                newest = max(newest, stat.st_mtime_ns)
    return LandingListing(files, total, newest, partitions)
