"""The environment of a ``sluice`` subprocess run by a test on a pipeline module of its own."""

from __future__ import annotations

import os
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
