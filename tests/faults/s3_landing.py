"""The S3 side of the object-store fault and cluster tests: landing files generated locally
(the oracle reads them there) are uploaded to the S3 server, each object in one PUT (as
Firehose or Kafka Connect's S3 sink lands them); the published table is read back from the
bucket into a local folder that ``fault_harness.verify`` reads.

Everything here goes through the test's own client (``S3Server.admin``), never through
Sluice's code.
"""

from __future__ import annotations

import posixpath
from pathlib import Path

import pyarrow.fs as pafs
from s3_server import S3Server

__all__ = ["MODULE", "PIPELINE", "ObjectLanding", "objects_under", "read_back"]

#: The pipeline module of these tests (``SLUICE_PIPELINES``) and its pipeline's name.
MODULE = "tests.faults.s3_clickstream"
PIPELINE = "clickstream_s3"


class ObjectLanding:
    """``local`` (generated ``dt=*/*.jsonl`` files) mirrored to ``s3://<bucket>/<prefix>``."""

    def __init__(self, s3: S3Server, bucket: str, prefix: str, local: Path) -> None:
        self.fs = s3.admin()
        self.bucket, self.prefix, self.local = bucket, prefix, local
        self.uri = f"s3://{bucket}/{prefix}"
        self._uploaded: set[str] = set()

    def upload_new(self) -> int:
        """PUT every local landing file not uploaded yet; returns how many."""
        new = sorted(
            path.relative_to(self.local).as_posix()
            for path in self.local.glob("dt=*/*.jsonl")
            if path.relative_to(self.local).as_posix() not in self._uploaded
        )
        for name in new:
            with self.fs.open_output_stream(f"{self.bucket}/{self.prefix}/{name}") as out:
                out.write((self.local / name).read_bytes())
            self._uploaded.add(name)
        return len(new)

    def objects(self) -> list[str]:
        """Every object under the landing prefix (relative names)."""
        return _objects(self.fs, f"{self.bucket}/{self.prefix}")


def objects_under(s3: S3Server, base: str) -> list[str]:
    """Every object under ``base`` (``bucket/prefix``; relative names)."""
    return _objects(s3.admin(), base)


def _objects(fs: pafs.FileSystem, base: str) -> list[str]:
    selector = pafs.FileSelector(base, recursive=True, allow_not_found=True)
    return sorted(
        posixpath.relpath(info.path, base)
        for info in fs.get_file_info(selector)
        if info.type == pafs.FileType.File
    )


def read_back(s3: S3Server, table: str, local: Path) -> tuple[Path, list[str]]:
    """Copy every object of ``table`` (``bucket/prefix``) into ``local``; returns the folder
    and the names that are not data files a reader lists (``_``/``.`` parts, not Parquet)."""
    fs = s3.admin()
    names = _objects(fs, table)
    other = [
        name
        for name in names
        if not name.endswith(".parquet") or any(p.startswith(("_", ".")) for p in name.split("/"))
    ]
    local.mkdir(parents=True, exist_ok=True)
    for name in names:
        if name in other:
            continue
        target = local / name
        target.parent.mkdir(parents=True, exist_ok=True)
        with fs.open_input_stream(f"{table}/{name}") as handle:
            target.write_bytes(handle.read())
    return local, other
