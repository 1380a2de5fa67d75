"""The sandbox a documentation page runs in: its environment (the test's own without its
settings, the venv first on PATH, its own SLUICE_HOME, small demo data, a free port for
``dagster dev``) and a ``sluice`` checkout that stands in for a fresh clone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

__all__ = ["DEMO_SIZES", "REPO", "VENV_BIN", "make_checkout", "page_env"]

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
#: Not copied into the sandbox's checkout: state, caches, and git's own files.
NOT_IN_CHECKOUT = {
    ".git",
    ".sluice",
    "data",
    "site",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    "__pycache__",
}
#: Sample data sizes for ``make demo`` / ``sluice demo`` on shell pages (the shipped
#: defaults, 200,000 events and 1,000,000 users, take a minute of the test's budget).
DEMO_SIZES = {
    "SLUICE_DEMO_EVENTS": "3000",
    "SLUICE_DEMO_USERS": "2000",
    "SLUICE_DEMO_DAYS": "2",
    "SLUICE_DEMO_FILES_PER_DAY": "1",
}


def page_env(sandbox: Path, port: int) -> dict[str, str]:
    """The environment of a page's blocks: the test's own without its SLUICE_* settings,
    the venv's bin first on PATH, SLUICE_HOME in the sandbox."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("SLUICE_", "DAGSTER_")) and key not in ("VIRTUAL_ENV",)
    }
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["SLUICE_HOME"] = str(sandbox / ".sluice")
    # Files appear and are discovered at once (the settle rule has tests of its own).
    env["SLUICE_FILE_SETTLE_SECONDS"] = "0"
    env.update(DEMO_SIZES)
    # `dagster dev` without -p listens here (its options read DAGSTER_CLI_DEV_*), so a test
    # never collides with a UI on 3000; background blocks wait for this port.
    env["SLUICE_DOCS_PORT"] = str(port)
    env["DAGSTER_CLI_DEV_PORT"] = str(port)
    env["COLUMNS"] = "120"
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    return env


def make_checkout(sandbox: Path) -> None:
    """``<sandbox>/sluice``: what a fresh clone holds (links to this checkout's files), without
    its state (.sluice, data), and a ``.venv`` whose ``bin`` and ``lib`` are the test's venv.

    Its install stamp is fresh, so ``make`` there never reinstalls: ``pip install -e`` from
    the sandbox would point the (shared) venv's editable install at the sandbox. (``make -o``
    cannot be passed through MAKEFLAGS: make leaves it out of the environment.)"""
    checkout = sandbox / "sluice"
    checkout.mkdir()
    for entry in REPO.iterdir():
        if entry.name not in NOT_IN_CHECKOUT and entry.name != ".venv":
            (checkout / entry.name).symlink_to(entry)
    venv = VENV_BIN.resolve().parent
    (checkout / ".venv").mkdir()
    for entry in venv.iterdir():
        if not entry.name.startswith(".installed-"):
            (checkout / ".venv" / entry.name).symlink_to(entry)
    cksum = subprocess.run(
        ["cksum", str(REPO / "pyproject.toml")], capture_output=True, text=True, check=True
    )
    (checkout / ".venv" / f".installed-{cksum.stdout.split()[0]}").touch()
