"""Where data lives: a URI (a local path, ``file://``, ``s3://``, ``gs://``, ``abfs://``,
``hdfs://``) turned into a :class:`Location` — a ``pyarrow.fs`` file system and a path on it.

Every file Sluice reads or writes goes through one of these, so the same code serves a local
folder and an object store. What differs is said by :attr:`Location.object_store`: an object
store has no rename, no inode, no symbolic link and no folders of its own; the code that
needs those (the local landing protections, the rename-based commit) asks first.

Credentials never pass through here: the S3 client takes them from the standard AWS chain
(``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, the instance role) in the
process that opens the file — the driver, the Dagster daemon, each Spark executor. A URI with
credentials in it (``s3://key:secret@bucket``) is refused, so none can reach a log, a repr,
an error, Dagster metadata or a Spark task closure. Only the endpoint and region (settings
``SLUICE_S3_ENDPOINT_URL``, ``SLUICE_S3_REGION``), which are not secret, travel with a
:class:`StorageOptions` value.

Threading: immutable values; a ``pyarrow.fs`` file system may be used from any thread.
"""

from __future__ import annotations

import functools
import posixpath
from dataclasses import dataclass
from os import PathLike, fspath
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pyarrow.fs as pafs

from enumerator_service._config import ConfigError

__all__ = [
    "OBJECT_STORE_SCHEMES",
    "Location",
    "StorageOptions",
    "check_uri",
    "is_uri",
    "open_location",
]

#: Schemes served by an object store or a remote file system (no rename, no inode).
OBJECT_STORE_SCHEMES = ("s3", "gs", "gcs", "abfs", "abfss", "hdfs")
_SCHEMES = ("file", *OBJECT_STORE_SCHEMES)


@dataclass(frozen=True, slots=True)
class StorageOptions:
    """The non-secret settings of the object-store clients (travel to Spark tasks)."""

    s3_endpoint_url: str | None = None
    s3_region: str | None = None

    @classmethod
    def of(cls, settings: Any) -> StorageOptions:
        """From :class:`~enumerator_service.Settings` (its ``s3_*`` fields)."""
        return cls(
            s3_endpoint_url=getattr(settings, "s3_endpoint_url", None),
            s3_region=getattr(settings, "s3_region", None),
        )


def is_uri(value: str | PathLike[str]) -> bool:
    """Whether ``value`` names a scheme (``s3://…``) rather than a local path."""
    text = fspath(value)
    return "://" in text and text.split("://", 1)[0].lower() in _SCHEMES


@functools.lru_cache(maxsize=32)
def _s3(options: StorageOptions) -> pafs.FileSystem:
    kwargs: dict[str, Any] = {}
    if options.s3_endpoint_url:
        endpoint = urlsplit(options.s3_endpoint_url)
        kwargs["endpoint_override"] = endpoint.netloc or endpoint.path
        kwargs["scheme"] = endpoint.scheme or "https"
    if options.s3_region:
        kwargs["region"] = options.s3_region
    # Short timeouts and few retries: an unreachable endpoint is an error within seconds
    # (the run fails and retries later), not a task that hangs for minutes.
    kwargs["connect_timeout"] = 5
    kwargs["request_timeout"] = 30
    kwargs["retry_strategy"] = pafs.AwsStandardS3RetryStrategy(max_attempts=3)
    return pafs.S3FileSystem(**kwargs)


@dataclass(frozen=True, slots=True)
class Location:
    """A folder on a file system: ``uri`` as shown to people, ``path`` as ``fs`` takes it.

    ``fs`` is rebuilt, not pickled, when a Location travels to a Spark task (see
    ``__reduce__``), so the executor's own credential chain applies there.
    """

    uri: str
    path: str
    options: StorageOptions
    fs: pafs.FileSystem

    @property
    def scheme(self) -> str:
        return self.uri.split("://", 1)[0].lower() if "://" in self.uri else "file"

    @property
    def object_store(self) -> bool:
        """True on S3 and the other remote stores: no rename, no inode, no symbolic link."""
        return self.scheme in OBJECT_STORE_SCHEMES

    @property
    def local_path(self) -> Path:
        """The local folder (ValueError on an object store)."""
        if self.object_store:
            raise ValueError(f"{self.uri} is not a local folder")
        return Path(self.path)

    def child(self, *parts: str) -> Location:
        """``self / part / …`` (parts are single names checked by the caller)."""
        path = posixpath.join(self.path, *parts)
        uri = posixpath.join(self.uri, *parts) if self.object_store else path
        return Location(uri, path, self.options, self.fs)

    def __str__(self) -> str:
        return self.uri

    def __repr__(self) -> str:
        return f"Location({self.uri!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (open_location, (self.uri, self.options))


def check_uri(uri: str, what: str = "location") -> None:
    """ConfigError(``what``, why) for a URI Sluice cannot use (unknown scheme, credentials in
    it, no bucket) — its form only: no file system is built, nothing is contacted."""
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme not in _SCHEMES:
        raise ConfigError(
            what,
            f"unsupported scheme {scheme + '://'!r} (use a local path, file://, "
            + ", ".join(s + "://" for s in OBJECT_STORE_SCHEMES)
            + ")",
        )
    if parts.username or parts.password:
        raise ConfigError(
            what,
            "credentials do not belong in the URI: use the standard chain (environment, "
            "profile, instance role)",
        )
    if scheme != "file" and not parts.netloc:
        raise ConfigError(what, f"{scheme}:// URI without a bucket or host")


def open_location(
    uri: str | PathLike[str], options: StorageOptions | None = None, *, what: str = "location"
) -> Location:
    """The :class:`Location` of ``uri``; ConfigError(``what``, why) for a URI Sluice cannot use
    (unknown scheme, credentials in it, no bucket). A relative local path is made absolute
    against the working folder — callers resolve it against their root first."""
    options = options or StorageOptions()
    text = fspath(uri)
    if "://" not in text:
        path = str(Path(text).absolute())
        return Location(path, path, options, pafs.LocalFileSystem())
    check_uri(text, what)
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    if scheme == "file":
        path = str(Path(unquote(parts.path)).absolute())
        return Location(path, path, options, pafs.LocalFileSystem())
    key = unquote(parts.path).strip("/")
    uri_text = f"{scheme}://{parts.netloc}" + (f"/{key}" if key else "")
    if scheme == "s3":
        path = posixpath.join(parts.netloc, key) if key else parts.netloc
        return Location(uri_text, path, options, _s3(options))
    try:
        fs, path = pafs.FileSystem.from_uri(uri_text)
    except Exception as exc:  # pyarrow: ArrowInvalid, ArrowNotImplementedError, OSError
        raise ConfigError(what, f"{uri_text}: {type(exc).__name__}: {exc}") from None
    return Location(uri_text, path, options, fs)
