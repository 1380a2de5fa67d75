"""Hostile values for every entry point that turns outside input into a path, and a snapshot
of a folder tree to prove that nothing outside a root changed."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["HOSTILE", "tree"]

HOSTILE = {
    "slash": "/",
    "dotdot": "..",
    "dot": ".",
    "climb": "a/../../b",
    "up-two": "../../outside",
    "nul": "run\x00id",
    "long": "r" * 5000,
    "empty": "",
    "absolute": "/etc/sluice-escape",
    "backslash": "..\\..\\x",
    "hidden": ".staging",
    "space": "run id",
}


def tree(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` (folders as None, files with their bytes)."""
    found: dict[str, bytes | None] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs:
            found[os.path.relpath(Path(folder, name), root)] = None
        for name in files:
            path = Path(folder, name)
            found[os.path.relpath(path, root)] = path.read_bytes()
    return found
