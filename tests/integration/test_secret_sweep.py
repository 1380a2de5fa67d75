"""Password files of killed drivers are swept at every start (CLI, job driver, Dagster
resource): a file whose owning process is gone (or whose pid now belongs to a process started
later) is removed; the file of a live driver is kept, and so is anything else in the folder.

The files are named as a driver names them (``db-<pid>-<start ticks>-<random>.password``).
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import TestSettings

SLUICE = str(Path(sys.executable).with_name("sluice"))
DAY = 24 * 3600


def _start_ticks(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_bytes()
    return int(stat[stat.rindex(b")") + 2 :].split()[19])


@pytest.fixture(scope="module")
def dead_driver() -> tuple[int, int]:
    """(pid, start ticks) of a process that has exited."""
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=-1)
    start = _start_ticks(child.pid)
    assert child.stdin is not None
    child.stdin.close()
    child.wait(30)
    return child.pid, start


@pytest.fixture
def live_driver() -> Iterator[tuple[int, int]]:
    """(pid, start ticks) of a process that runs for the whole test (a driver elsewhere)."""
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=-1)
    try:
        yield child.pid, _start_ticks(child.pid)
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(30)


def _secrets(home: Path, dead: tuple[int, int], live: tuple[int, int]) -> dict[str, Path]:
    folder = home / "secrets"
    folder.mkdir(parents=True, mode=0o700)
    files = {
        "dead": folder / f"db-{dead[0]}-{dead[1]}-{secrets.token_hex(8)}.password",
        "live": folder / f"db-{live[0]}-{live[1]}-{secrets.token_hex(8)}.password",
        # The live pid, but a process that started at another time: the pid was reused.
        "reused": folder / f"db-{live[0]}-{live[1] + 1}-{secrets.token_hex(8)}.password",
        "old_unowned": folder / f"db-{secrets.token_hex(8)}.password",
        "new_unowned": folder / f"db-{secrets.token_hex(8)}.password",
        "other": folder / "not-ours.txt",
    }
    for path in files.values():
        path.write_text("pw-value\n")
        path.chmod(0o600)
    old = time.time() - 2 * DAY
    os.utime(files["old_unowned"], (old, old))
    return files


def _assert_swept(files: dict[str, Path]) -> None:
    left = {name for name, path in files.items() if path.exists()}
    assert left == {"live", "new_unowned", "other"}


def _cli_start(settings: TestSettings, tmp_path: Path, db_url: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    env |= {"SLUICE_HOME": str(settings.home_path), "SLUICE_DATABASE_URL": db_url}
    (tmp_path / "sweep_pipes.py").write_text(
        "from spark_jobs import FileSource, Pipeline\n"
        'pipe = Pipeline(name="sweep_pipe", source=FileSource(schema={"x": "int64"}))\n'
    )
    env["SLUICE_PIPELINES"] = "sweep_pipes"
    result = subprocess.run(
        [SLUICE, "pipelines"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "pw-value" not in result.stdout + result.stderr


def _driver_start(settings: TestSettings, tmp_path: Path, db_url: str) -> None:
    from spark_jobs import FileSource, Pipeline
    from spark_jobs.jobs import run_pipeline

    pipeline = Pipeline(name=settings.source_name, source=FileSource(schema={"x": "int64"}))
    summary = run_pipeline(settings, pipeline)  # nothing discovered: no Spark needed
    assert summary.splits == 0


def _dagster_start(settings: TestSettings, tmp_path: Path, db_url: str) -> None:
    from dagster import build_init_resource_context

    from dagster_project.resources import PathsResource, SluiceResource

    resource = SluiceResource(paths=PathsResource(home=str(settings.home_path)))
    resource.setup_for_execution(build_init_resource_context())


@pytest.mark.parametrize("start", [_cli_start, _driver_start, _dagster_start])
def test_a_start_sweeps_the_password_files_of_dead_drivers(
    make_settings: Any,
    db_url: str,
    tmp_path: Path,
    dead_driver: tuple[int, int],
    live_driver: tuple[int, int],
    start: Callable[[TestSettings, Path, str], None],
) -> None:
    settings: TestSettings = make_settings()
    files = _secrets(settings.home_path, dead_driver, live_driver)
    start(settings, tmp_path, db_url)
    _assert_swept(files)
