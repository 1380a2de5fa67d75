"""A landing folder on an object store (``s3://bucket/prefix``, and through the same code
``gs://``, ``abfs://``, ``hdfs://``): listing, identity, opening, and the errors of a store
that cannot be reached.

Listing goes through ``pyarrow.fs`` (``FileSelector``, never recursive): the root's ``dt=``
prefixes first, then the objects directly in each day prefix (only the ``dates`` asked for,
when given), one prefix at a time. pyarrow materialises one listing as a list (it pages
through the store's API underneath), so discovery's memory is bounded by the largest *one*
prefix (a day), not by every key of the landing; the discovery *state* stays the bounded
cursor of ``ContinuousFileEnumerator`` (a modification-time watermark plus the keys of the
last lookback window).

What an object store does not have, and what it means here:

- *no inode, no ctime, no symbolic link*: an object's identity is ``(size, mtime)``
  (:meth:`~enumerator_service._file_identity.FileIdentity.of_object`); the local
  protections (``LandingRoot``: links, inode checks) do not apply, and no key is ever
  followed anywhere: only keys *inside* the landing prefix are listed and opened;
- *the store's clock*: every time compared (the cursor's watermark, the lookback window) is
  an object's ``Last-Modified``, so the local clock's skew does not matter;
- *no partial objects*: an object appears whole when its PUT (or multipart upload)
  completes, so the settle time (``SLUICE_FILE_SETTLE_SECONDS``, a heuristic for local
  writers that write in place) is skipped: every listed object is registered at once;
- *Last-Modified is when the upload started* (multipart: at its initiation): the lookback
  window (``lookback_seconds``) must exceed the longest upload, or an upload that completes
  later than that behind the watermark is not seen by the continuous discovery (a bounded
  discovery of its day — a backfill — still finds it);
- *no append*: a changed object is a new version (another size or mtime), refused or read
  again whole by the change policy, exactly as a replaced local file.

Keys that cannot be named safely — with an empty, ``.`` or ``..`` path segment (``a//b``,
``a/../b``, a leading ``/`` under the bucket root) — show up in a listing as odd folders:
they are skipped and logged once each. Keys with spaces or any Unicode are read as they are.

Reading (:meth:`ObjectLanding.open`) goes through a file whose every request to the store
is followed by a check of the object's identity (one HEAD per 8 MiB read): an object
overwritten *while* a split is read fails the split as changed at the first read after the
overwrite, before any of the new bytes are handed out — never half of each version.

Threading: immutable values; the warning memo is shared with ``_landing`` (any thread).
"""

from __future__ import annotations

import io
import logging
import posixpath
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date
from typing import BinaryIO, cast

import pyarrow as pa
import pyarrow.fs as pafs

from enumerator_service._config import ConfigError, ServerUnreachable
from enumerator_service._file_identity import (
    FileIdentity,
    check_unchanged,
    current,
)
from enumerator_service._landing import LandingRoot, OutsideLandingError, _kind_of, landing_days
from enumerator_service._secrets import redact_text
from enumerator_service._storage import Location, StorageOptions, is_uri, open_location

__all__ = [
    "ObjectLanding",
    "OutsidePrefixError",
    "StorageError",
    "days_with_files",
    "identity_now",
    "open_for_footer",
    "storage_error",
]

_log = logging.getLogger(__name__)

_PARTITION_DIR = re.compile(r"^dt=(\d{4}-\d{2}-\d{2})$")
#: Bytes per request to the store when reading a split (each followed by an identity check).
READ_BYTES = 8 << 20
_ODD_SEGMENTS = frozenset({"", ".", ".."})

#: A listed data file: (URI, kind, partition date, identity).
Listed = tuple[str, str, date | None, FileIdentity]


class StorageError(ConfigError):
    """The store behind a landing URI cannot be used (unreachable, access denied, no such
    bucket): one line naming the URI and the setting to check. Nothing was registered."""


class StorageUnreachable(StorageError, ServerUnreachable):
    """The store's endpoint does not answer (an outage, or a wrong endpoint): exit code 1."""


class OutsidePrefixError(OutsideLandingError):
    """A split's URI is not a plain key inside the landing prefix: it is not read."""


def storage_error(what: str, exc: BaseException, options: StorageOptions) -> StorageError:
    """``exc`` (a ``pyarrow.fs`` OSError) as one line: what is wrong and which setting or
    URI to look at. Never the credentials (the store's errors do not carry them; the text is
    redacted anyway)."""
    text = " ".join(str(exc).split())
    upper = text.upper()
    if any(
        marker in upper
        for marker in ("NETWORK_CONNECTION", "CURLCODE", "COULD NOT CONNECT", "TIMED OUT")
    ):
        endpoint = options.s3_endpoint_url or "the store's default endpoint"
        why = f"the storage endpoint {endpoint} is unreachable (setting SLUICE_S3_ENDPOINT_URL)"
        return StorageUnreachable(what, why)
    if "NO_SUCH_BUCKET" in upper or "NOSUCHBUCKET" in upper:
        why = "the bucket does not exist (check the landing URI)"
    elif any(
        marker in upper
        for marker in (
            "ACCESS_DENIED",
            "ACCESSDENIED",
            "INVALIDACCESSKEYID",
            "INVALID_ACCESS_KEY_ID",
            "SIGNATUREDOESNOTMATCH",
            "SIGNATURE_DOES_NOT_MATCH",
            "HTTP STATUS 403",
        )
    ):
        why = (
            "access denied: check the credentials of the standard chain (AWS_ACCESS_KEY_ID / "
            "AWS_SECRET_ACCESS_KEY, AWS_PROFILE, the instance role) and the bucket's policy"
        )
    else:
        why = redact_text(text)[:300]
    return StorageError(what, why)


@dataclass(frozen=True, slots=True)
class ObjectLanding:
    """The landing prefix ``location`` on an object store (see the module docstring)."""

    location: Location

    @classmethod
    def of(cls, uri: str, options: StorageOptions) -> ObjectLanding:
        return cls(open_location(uri, options, what="landing"))

    @property
    def uri(self) -> str:
        return self.location.uri

    # -- names ---------------------------------------------------------------------------

    def uri_of(self, path: str) -> str:
        """The URI of the object at file-system path ``path`` (inside the prefix)."""
        return self.uri + path[len(self.location.path) :]

    def path_of(self, uri: str) -> str:
        """The file-system path of ``uri``; :class:`OutsidePrefixError` unless it is a plain
        key inside the landing prefix (no empty, ``.`` or ``..`` segment)."""
        root = self.uri.rstrip("/") + "/"
        if not uri.startswith(root):
            raise OutsidePrefixError(f"{uri} is not inside the landing prefix {self.uri}: refused")
        rest = uri[len(root) :]
        if any(part in _ODD_SEGMENTS for part in rest.split("/")):
            raise OutsidePrefixError(
                f"{uri} has an empty, '.' or '..' path segment: refused (rename the object)"
            )
        return posixpath.join(self.location.path, rest)

    # -- listing -------------------------------------------------------------------------

    def data_files(
        self,
        *,
        partitioned: bool,
        dates: frozenset[date] | None,
        bad_names: list[str] | None = None,
    ) -> Iterator[Listed]:
        """(URI, kind, partition date, identity) of the data objects: in the ``dt=`` prefixes
        (only ``dates`` if given) when ``partitioned``, else directly under the prefix. Odd
        keys are logged once and appended to ``bad_names``."""
        base = self.location.path
        if not partitioned:
            yield from self._folder(base, None, bad_names)
        elif dates is not None:
            for day in sorted(dates):
                yield from self._folder(f"{base}/dt={day.isoformat()}", day, bad_names)
        else:
            for folder, day in self.day_prefixes(bad_names):
                yield from self._folder(folder, day, bad_names)

    def day_prefixes(self, bad_names: list[str] | None = None) -> list[tuple[str, date]]:
        """The ``dt=YYYY-MM-DD`` prefixes directly under the landing prefix, by day."""
        found = []
        for info in self._list(self.location.path, bad_names):
            if info.type != pafs.FileType.Directory:
                continue
            match = _PARTITION_DIR.match(info.base_name)
            if match:
                found.append((info.path, date.fromisoformat(match.group(1))))
        return sorted(found, key=lambda pair: pair[1])

    def landing_days(self) -> set[date]:
        """The days of ``dt=`` prefixes that hold a data object discovery would list."""
        days = set()
        for folder, day in self.day_prefixes():
            if next(self._folder(folder, day, None), None) is not None:
                days.add(day)
        return days

    def _list(self, folder: str, bad_names: list[str] | None) -> list[pafs.FileInfo]:
        selector = pafs.FileSelector(folder, recursive=False, allow_not_found=True)
        entries = self.location.fs.get_file_info(selector)
        if not entries:
            # Nothing under the prefix (files are to come) — unless the bucket is missing,
            # which a listing that allows "not found" does not say.
            bucket = folder.split("/", 1)[0]
            if self.location.fs.get_file_info(bucket).type == pafs.FileType.NotFound:
                raise FileNotFoundError(f"NO_SUCH_BUCKET: bucket {bucket!r} does not exist")
        plain = []
        directory = pafs.FileType.Directory
        for info in entries:
            if info.type == directory:
                path = info.path
                name = path[len(folder) :].lstrip("/") if path != folder else ""
                if name in _ODD_SEGMENTS or path.rstrip("/") == folder.rstrip("/"):
                    # ``a//b``, ``a/./b``, ``a/../b``: a key that could name something
                    # outside.
                    shown = self.uri_of(folder) + "/" + (name or "/")
                    LandingRoot._warn(
                        shown,
                        "holds keys with an empty, '.' or '..' path segment: skipped (rename them)",
                    )
                    if bad_names is not None:
                        bad_names.append(shown)
                    continue
            plain.append(info)
        return plain

    def _folder(
        self, folder: str, day: date | None, bad_names: list[str] | None
    ) -> Iterator[Listed]:
        prefix = folder.rstrip("/") + "/"
        cut = len(prefix)
        uri_prefix = self.uri_of(prefix)
        file = pafs.FileType.File
        for info in self._list(folder, bad_names):
            if info.type != file:
                continue
            path = info.path
            name = path[cut:]
            if not path.startswith(prefix) or "/" in name:
                continue  # not directly in this prefix (never expected from a listing)
            kind = _kind_of(name)
            # Hidden and "_" objects are in-flight writes or markers, never data.
            if kind is None or name.startswith((".", "_")):
                continue
            identity = FileIdentity.of_object(info.size or 0, info.mtime_ns or 0)
            yield uri_prefix + name, kind, day, identity

    # -- reading -------------------------------------------------------------------------

    def current(self, uri: str) -> FileIdentity | None:
        """The identity of the object at ``uri`` now (one HEAD); None when it is gone."""
        info = self.location.fs.get_file_info(self.path_of(uri))
        if info.type != pafs.FileType.File:
            return None
        return FileIdentity.of_object(info.size or 0, info.mtime_ns or 0)

    def open(self, uri: str, expected: FileIdentity | None = None) -> BinaryIO:
        """``uri`` opened for binary reading through the store; with ``expected`` (the
        identity its splits were cut for) every request is followed by an identity check
        (``FileChangedError`` at the first read after an overwrite). FileNotFoundError when
        the object is gone."""
        native = self.location.fs.open_input_file(self.path_of(uri))
        raw = _CheckedObject(native, uri, expected, self.current)
        return cast(BinaryIO, io.BufferedReader(raw, buffer_size=READ_BYTES))

    def open_native(self, uri: str) -> pa.NativeFile:
        """``uri`` as an Arrow file (random access: Parquet reads its footer, then its column
        chunks, each a ranged request)."""
        return self.location.fs.open_input_file(self.path_of(uri))


class _CheckedObject(io.RawIOBase):
    """An object read in ranged requests, each followed by an identity check."""

    def __init__(
        self, native: pa.NativeFile, uri: str, expected: FileIdentity | None, identity_of: object
    ) -> None:
        super().__init__()
        self._native = native
        self._uri = uri
        self._expected = expected
        self._identity_of = identity_of

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return int(self._native.seek(offset, whence))

    def tell(self) -> int:
        return int(self._native.tell())

    def readinto(self, buffer: memoryview | bytearray) -> int:  # type: ignore[override]
        try:
            data = self._native.read(len(buffer))
        except OSError:
            if self._identity_of(self._uri) is None:  # type: ignore[operator]
                # Deleted while being read: the file-gone rule, as at open.
                raise FileNotFoundError(f"{self._uri} was deleted while being read") from None
            raise
        if data and self._expected is not None:
            check_unchanged(self._uri, self._expected, self._identity_of)  # type: ignore[arg-type]
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        try:
            self._native.close()
        finally:
            super().close()


def _object(uri: str, options: StorageOptions) -> tuple[Location, str]:
    """The store of an object's URI and the object's path on it. The key is taken as it is
    (not parsed as a URL: a key may hold ``%``, ``#`` or ``?``)."""
    scheme, rest = uri.split("://", 1)
    netloc, _, key = rest.partition("/")
    root = open_location(f"{scheme}://{netloc}", options, what="landing file")
    return root, (posixpath.join(root.path, key) if key else root.path)


def identity_now(uri: str, options: StorageOptions) -> FileIdentity | None:
    """The identity of the landing file ``uri`` now — a local path (``stat``) or an
    object's URI (a HEAD) — None when it is gone."""
    if not is_uri(uri) or uri.lower().startswith("file://"):
        return current(uri.removeprefix("file://"))
    root, path = _object(uri, options)
    info = root.fs.get_file_info(path)
    if info.type != pafs.FileType.File:
        return None
    return FileIdentity.of_object(info.size or 0, info.mtime_ns or 0)


def open_for_footer(uri: str, options: StorageOptions) -> BinaryIO:
    """A landing file opened for reading its Parquet footer (local or on a store)."""
    if not is_uri(uri) or uri.lower().startswith("file://"):
        return open(uri.removeprefix("file://"), "rb")
    root, path = _object(uri, options)
    return cast(BinaryIO, root.fs.open_input_file(path))


def days_with_files(location: Location, *, follow_symlinks: bool = False) -> set[date]:
    """The days of ``location``'s ``dt=`` folders (or prefixes) holding a data file
    discovery would list: a local folder (its link rules) or a prefix on a store."""
    if location.object_store:
        return ObjectLanding(location).landing_days()
    root = LandingRoot.of(location.path, follow_symlinks=follow_symlinks)
    return landing_days(location.path, root)
