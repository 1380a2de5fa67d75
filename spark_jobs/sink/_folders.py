"""Atomic folder replacement: what a table partition's readers see is one folder or the other."""

from __future__ import annotations

import ctypes
import os
import shutil
import sys
import uuid
from pathlib import Path

__all__ = ["exchange_folders", "fsync_path", "replace_folder"]

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def exchange_folders(first: Path, second: Path) -> bool:
    """Swap two existing paths in one atomic step (Linux ``renameat2``); False if unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:  # glibc < 2.28 or another libc
        return False
    renameat2.argtypes = [
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_uint,
    ]
    result = renameat2(
        _AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE
    )
    return bool(result == 0)


def fsync_path(path: Path) -> None:
    """Make a file's content, or a folder's entries (renames into or out of it), durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_folder(new: Path, final: Path) -> None:
    """Make ``new`` the folder at ``final``, replacing any previous one.

    Readers see either the old folder or the new one: a fresh ``final`` is one rename, an
    existing one is swapped in one ``renameat2(RENAME_EXCHANGE)``. Where the file system does
    not support that, the old folder is renamed aside first (a moment without the folder).
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    if not final.exists():
        os.rename(new, final)
    elif exchange_folders(new, final):
        shutil.rmtree(new)  # holds the previous output now
    else:
        old = final.with_name(f"_old-{uuid.uuid4().hex[:8]}-{final.name}")
        os.rename(final, old)
        os.rename(new, final)
        shutil.rmtree(old, ignore_errors=True)
