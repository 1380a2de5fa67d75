"""Names from outside input that become path parts, and the proof that a path stays under
its root.

Run ids (the ``sluice/run_id`` Dagster run tag can be set by anyone who can launch a run),
pipeline and table names and relative landing folders end up in ``Path`` objects that the
platform writes to and deletes (``shutil.rmtree(staging / run_id)``). Every such value goes
through :func:`safe_name` at its entry point, and every path built from one through
:func:`child_path`, which also resolves the result and checks it is under the root (a
symlinked part cannot lead out either). A rejected value is one :class:`ConfigError` line
naming the input; it never echoes more than a short prefix of the value.
"""

from __future__ import annotations

import re
from datetime import date
from pathlib import Path, PurePath

from enumerator_service._config import ConfigError

__all__ = ["MAX_NAME", "child_path", "partition_date", "relative_under", "safe_name"]

#: Longest accepted name (a Dagster run id with its ``dagster-`` prefix is 44 characters).
MAX_NAME = 128
#: One path part: starts with a letter or digit (so never ``.``, ``..`` or a hidden name),
#: then letters, digits, ``.``, ``_`` and ``-``; no separator, no NUL, no whitespace.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_DAY = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 48 else f"{text[:40]}… ({len(str(value))} characters)"


def safe_name(value: object, what: str) -> str:
    """``value`` if it can be one path part, else ConfigError(``what``, why).

    Accepted: 1 to :data:`MAX_NAME` characters of ``[A-Za-z0-9._-]`` starting with a letter
    or a digit. That rules out ``/``, ``\\``, ``..``, NUL, empty and absolute values.
    """
    if not isinstance(value, str):
        raise ConfigError(what, f"must be a string, got {type(value).__name__}")
    if not value:
        raise ConfigError(what, "must not be empty")
    if len(value) > MAX_NAME:
        raise ConfigError(what, f"{_shown(value)} is longer than {MAX_NAME} characters")
    if not _NAME.fullmatch(value):
        raise ConfigError(
            what,
            f"{_shown(value)} is not a safe name (letters, digits, '.', '_', '-'; "
            "starting with a letter or digit)",
        )
    return value


def child_path(root: Path, *parts: str, what: str, resolve: bool = True) -> Path:
    """``root / part / …`` after each part passed :func:`safe_name`; with ``resolve`` (for
    folders Sluice deletes or publishes into) also proven to resolve under ``root``, so a
    symlinked part cannot lead out; else ConfigError(``what``, why)."""
    path = root
    for part in parts:
        path = path / safe_name(part, what)
    if not resolve:
        return path  # validated parts cannot leave root lexically
    base = root.resolve()
    if not path.resolve().is_relative_to(base):
        raise ConfigError(what, f"{path} leads out of {base}")
    return path


def relative_under(root: Path, given: PurePath, what: str) -> Path:
    """``root / given`` for a relative ``given`` without ``..`` (or NUL); else
    ConfigError(``what``, why). Checked lexically: a landing folder may itself be a symlink
    to a mounted volume (what is read through links inside it is the source's concern)."""
    text = str(given)
    if "\x00" in text:
        raise ConfigError(what, f"{_shown(text)} contains a NUL character")
    if given.is_absolute() or ".." in given.parts:
        raise ConfigError(what, f"{_shown(text)} must be a relative path without '..'")
    return root / given


def partition_date(key: object, what: str) -> date:
    """A day partition key (``YYYY-MM-DD``; it becomes a ``dt=`` folder) as a date, else
    ConfigError(``what``, why)."""
    if not isinstance(key, str) or not _DAY.fullmatch(key):
        raise ConfigError(what, f"{_shown(key)} is not a day (YYYY-MM-DD)")
    try:
        return date.fromisoformat(key)
    except ValueError as exc:
        raise ConfigError(what, f"{_shown(key)}: {exc}") from None
