"""The environment of a ``sluice`` subprocess run by a test on a pipeline module of its own,
and running it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def module_env(db_url: str, cwd: Path, module: str, **extra: str) -> dict[str, str]:
    """The caller's environment without its ``SLUICE_*`` settings, plus a run of ``module``
    (a file in ``cwd``, put on ``PYTHONPATH``) on ``db_url`` with two local subtasks."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    env.update(
        SLUICE_DATABASE_URL=db_url,
        SLUICE_PIPELINES=module,
        SLUICE_HOME=str(cwd / "home"),
        SLUICE_SPARK_MASTER="local[2]",
        SLUICE_PARALLELISM="2",
        COLUMNS="400",  # rich: one table row per line
        PYTHONPATH=os.pathsep.join([str(cwd), os.environ.get("PYTHONPATH", "")]),
    )
    env.update(extra)
    return env


SLUICE = str(Path(sys.executable).with_name("sluice"))


def run_sluice(
    args: list[str],
    env: dict[str, str],
    cwd: Path,
    *,
    unset: tuple[str, ...] = (),
    secret: str | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """``sluice *args`` in ``cwd`` with the caller's environment minus its ``SLUICE_*``
    settings and ``unset``, plus ``env``; ``secret`` (a password) must appear in no output."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_") and k not in unset}
    done = subprocess.run(
        [SLUICE, *args],
        env={**clean, **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if secret is not None:
        assert secret not in done.stdout + done.stderr, args
    return done
