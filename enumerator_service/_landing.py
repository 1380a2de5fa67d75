"""What a landing folder holds: its data files (:func:`data_files`: ``dt=`` folders, kinds
by file name) and where its symbolic links may lead, at discovery and at read time.

The *root* is the landing folder with every link in its own path resolved (so a landing
folder that is itself a link to a big disk works). A link inside it — a data file or a
``dt=`` partition folder — is followed when its target resolves inside the root; a link
leading out of it is skipped by discovery (logged once per link, counted in the discovery
result) unless ``SLUICE_FOLLOW_SYMLINKS`` is on. A broken link or a link loop is skipped
whatever the setting (there is nothing to read).

A file whose name is not UTF-8 (Linux names are bytes; Python shows the undecodable bytes as
surrogate escapes, which Postgres text refuses) is skipped too: logged once with its name
escaped (``caf\\xe9.jsonl``), counted apart, and never stops the listing of the rest.

Discovery's check is not enough on its own: a link can be swapped after the file was
registered. :meth:`LandingRoot.open` therefore checks again at open time, on the file it
actually opened: it opens the path, resolves the path, and accepts the open file only if the
resolved path is inside the root *and* is the very file opened (same device and inode). A
swap between the two steps makes them disagree, and the read is refused.

Threading: immutable values; the warning memo is guarded by a lock (any thread).
"""

from __future__ import annotations

import logging
import os
import re
import stat
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import BinaryIO

from enumerator_service._file_identity import FileIdentity

__all__ = ["LandingRoot", "OutsideLandingError", "data_files", "landing_days"]

_log = logging.getLogger(__name__)

_PARTITION_DIR = re.compile(r"^dt=(\d{4}-\d{2}-\d{2})$")
#: File suffix -> split kind; longest suffix first. Only kinds with a split reader.
_KINDS = (
    (".jsonl.gz", "jsonl.gz"),
    (".csv.gz", "csv.gz"),
    (".jsonl", "jsonl"),
    (".json", "jsonl"),
    (".csv", "csv"),
    (".parquet", "parquet"),
)


def _kind_of(name: str) -> str | None:
    for suffix, kind in _KINDS:
        if name.endswith(suffix):
            return kind
    return None


#: Links warned about in this process: each is logged once, not on every tick.
_WARNED: set[str] = set()
_WARNED_MAX = 10_000
_WARNED_LOCK = threading.Lock()


class OutsideLandingError(PermissionError):
    """A landing file resolves outside the landing folder (a symbolic link) and following
    such links is off: it is not read."""


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def data_files(
    landing: str | Path,
    root: LandingRoot,
    skipped: list[str],
    *,
    partitioned: bool,
    dates: frozenset[date] | None,
    bad_names: list[str] | None = None,
) -> Iterator[tuple[str, str, date | None, FileIdentity]]:
    """(path, kind, partition date, identity) of the data files of ``landing``: in its
    ``dt=YYYY-MM-DD`` folders (only ``dates`` if given) when ``partitioned``, else directly
    in it. A link that ``root`` does not follow is appended to ``skipped`` instead, a file
    whose name is not UTF-8 to ``bad_names`` (escaped)."""
    if not partitioned:
        yield from _folder_files(landing, None, root, skipped, bad_names)
        return
    with os.scandir(landing) as partitions:
        for entry in partitions:
            match = _PARTITION_DIR.match(entry.name)
            if not match:
                continue
            if not _is(entry, True, root, skipped):
                continue
            day = date.fromisoformat(match.group(1))
            if dates is not None and day not in dates:
                continue
            yield from _folder_files(entry.path, day, root, skipped, bad_names)


def landing_days(landing: str | Path, root: LandingRoot) -> set[date]:
    """The days of ``landing``'s ``dt=`` folders that hold a data file discovery would list
    (one file found is enough: no stat of the others). None yet: an empty set."""
    if not os.path.isdir(landing):
        return set()
    days: set[date] = set()
    skipped: list[str] = []
    with os.scandir(landing) as partitions:
        for entry in partitions:
            match = _PARTITION_DIR.match(entry.name)
            if not match or not _is(entry, True, root, skipped):
                continue
            if next(_folder_files(entry.path, None, root, skipped), None) is not None:
                days.add(date.fromisoformat(match.group(1)))
    return days


def _is(entry: os.DirEntry[str], folder: bool, root: LandingRoot, skipped: list[str]) -> bool:
    """Whether ``entry`` is a folder (``folder``) or a regular file — through a link only if
    ``root`` follows it; a link it does not follow is appended to ``skipped``. A plain entry
    answers from the scan (no extra stat per file on the discovery path)."""
    if not entry.is_symlink():
        return entry.is_dir() if folder else entry.is_file()
    target = root.link_target(entry.path)
    if target is None:
        skipped.append(entry.path)
        return False
    return os.path.isdir(target) if folder else os.path.isfile(target)


def _escaped(path: str) -> str:
    """``path`` printable: bytes that are not UTF-8 (surrogate escapes) as ``\\xNN``."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _folder_files(
    folder: str | Path,
    day: date | None,
    root: LandingRoot,
    skipped: list[str],
    bad_names: list[str] | None = None,
) -> Iterator[tuple[str, str, date | None, FileIdentity]]:
    """(path, kind, ``day``, identity) of the data files directly in ``folder``; a link
    that may not be followed (see ``LandingRoot``) is appended to ``skipped`` instead, a
    name that is not UTF-8 to ``bad_names`` (escaped)."""
    with os.scandir(folder) as files:
        for file in files:
            kind = _kind_of(file.name)
            # Hidden and "_" files are in-flight writes or markers, never data.
            if kind is None or file.name.startswith((".", "_")):
                continue
            if not file.path.isascii() and _not_utf8(file.path):
                shown = _escaped(file.path)
                LandingRoot._warn(shown, "has a name that is not UTF-8: skipped (rename it)")
                if bad_names is not None:
                    bad_names.append(shown)
                continue
            if not _is(file, False, root, skipped):
                continue
            stat = file.stat()  # the target's, for a link
            # A link is registered under its own name: the reader checks it again at open.
            yield os.path.abspath(file.path), kind, day, FileIdentity.of(stat)


def _not_utf8(path: str) -> bool:
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:  # a surrogate escape: the name's bytes are not UTF-8
        return True
    return False


@dataclass(frozen=True, slots=True)
class LandingRoot:
    """The resolved landing folder ``path`` and whether links may lead out of it."""

    path: str
    follow_symlinks: bool = False

    @classmethod
    def of(cls, landing: str | Path, *, follow_symlinks: bool = False) -> LandingRoot:
        return cls(os.path.realpath(landing), follow_symlinks)

    def link_target(self, link: str) -> str | None:
        """Where the link ``link`` leads if it may be followed, else None (broken, a loop, or
        out of the root with following off — then logged, once per link)."""
        try:
            target = os.path.realpath(link, strict=True)
        except OSError as exc:  # dangling, a loop, unreadable
            self._warn(link, f"is a broken symbolic link ({exc.strerror or exc}): skipped")
            return None
        if self.follow_symlinks or _inside(target, self.path):
            return target
        self._warn(
            link,
            f"is a symbolic link to {target}, outside the landing folder {self.path}: skipped "
            "(set SLUICE_FOLLOW_SYMLINKS=true to follow links out of it)",
        )
        return None

    def open(self, path: str) -> BinaryIO:
        """``path`` opened for binary reading; :class:`OutsideLandingError` when it resolves
        outside the root (following off) or was swapped while being opened, OSError when it
        is not a regular file."""
        # Non-blocking: a FIFO swapped in must not hang the open (regular files ignore it).
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        try:
            opened = os.fstat(fd)
            if not stat.S_ISREG(opened.st_mode):
                raise OSError(f"{path} is not a regular file")
            if not self.follow_symlinks:
                self._check(path, opened)
            os.set_blocking(fd, True)
            return os.fdopen(fd, "rb")
        except BaseException:
            os.close(fd)
            raise

    def _check(self, path: str, opened: os.stat_result) -> None:
        real = os.path.realpath(path)
        try:
            resolved = os.stat(real)
        except OSError:
            resolved = None
        if not _inside(real, self.path):
            raise OutsideLandingError(
                f"{path} resolves to {real}, outside the landing folder {self.path}: refused "
                "(set SLUICE_FOLLOW_SYMLINKS=true to follow links out of it)"
            )
        if resolved is None or (resolved.st_dev, resolved.st_ino) != (
            opened.st_dev,
            opened.st_ino,
        ):
            raise OutsideLandingError(f"{path} changed while it was opened: refused")

    @staticmethod
    def _warn(link: str, problem: str) -> None:
        with _WARNED_LOCK:
            if link in _WARNED:
                return
            if len(_WARNED) >= _WARNED_MAX:
                _WARNED.clear()
            _WARNED.add(link)
        _log.warning("landing file %s %s", link, problem)
