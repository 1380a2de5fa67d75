"""The sluice CLI: configuration errors fail fast, commands work on a real database."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SLUICE = str(Path(sys.executable).with_name("sluice"))


def _run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    return subprocess.run(
        [SLUICE, *args], env={**clean, **env}, cwd=cwd, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    ("env", "setting"),
    [
        (
            {"SLUICE_DATABASE_URL": "postgresql://sluice:hunter2@127.0.0.1:9/none"},
            "SLUICE_DATABASE_URL",
        ),
        ({"SLUICE_DATABASE_URL": "mysql://x@y/z"}, "SLUICE_DATABASE_URL"),
        ({"SLUICE_LOOKUP_TABLE": "users; DROP TABLE x"}, "SLUICE_LOOKUP_TABLE"),
        ({"SLUICE_SOURCE_NAME": "Events"}, "SLUICE_SOURCE_NAME"),
        ({"SLUICE_PARALLELISM": "0"}, "SLUICE_PARALLELISM"),
        ({"SLUICE_DISCOVERY_MAX_FILES_PER_TICK": "0"}, "SLUICE_DISCOVERY_MAX_FILES_PER_TICK"),
        (
            {"SLUICE_DISCOVERY_MAX_FILES_PER_TICK": "many"},
            "SLUICE_DISCOVERY_MAX_FILES_PER_TICK",
        ),
    ],
)
def test_bad_configuration_is_one_line_and_exit_2(
    env: dict[str, str], setting: str, tmp_path: Path
) -> None:
    result = _run(["status"], env, tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and setting in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    assert "hunter2" not in result.stderr + result.stdout


def test_missing_landing_folder_names_the_setting(db_url: str, tmp_path: Path) -> None:
    env = {"SLUICE_DATABASE_URL": db_url, "SLUICE_LANDING_DIR": str(tmp_path / "nope")}
    result = _run(["discover"], env, tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().startswith("sluice: configuration error: SLUICE_LANDING_DIR")


def test_status_and_discover_on_a_real_database(
    make_settings: Any, db_url: str, tmp_path: Path
) -> None:
    landing = tmp_path / "landing"
    (landing / "dt=2026-01-01").mkdir(parents=True)
    (landing / "dt=2026-01-01" / "part-0.jsonl").write_text('{"x": 1}\n')
    env = {
        "SLUICE_DATABASE_URL": db_url,
        "SLUICE_LANDING_DIR": str(landing),
        "SLUICE_SOURCE_NAME": "cli_events",
    }
    first = _run(["discover"], env, tmp_path)
    assert first.returncode == 0, first.stderr
    assert "1 new splits registered" in first.stdout
    second = _run(["discover"], env, tmp_path)
    assert "0 new splits registered" in second.stdout
    status = _run(["status"], env, tmp_path)
    assert status.returncode == 0, status.stderr
    assert "splits unassigned" in status.stdout and "1" in status.stdout


def test_replace_needs_the_partitions_to_replace(tmp_path: Path) -> None:
    result = _run(["run", "--replace"], {}, tmp_path)
    assert result.returncode == 2
    assert "--replace needs the partitions to replace (--date)" in result.stderr
    assert "Traceback" not in result.stderr


def test_discover_drains_a_backlog_larger_than_the_per_tick_cap(
    db_url: str, tmp_path: Path
) -> None:
    landing = tmp_path / "landing"
    (landing / "dt=2026-01-01").mkdir(parents=True)
    for i in range(5):
        (landing / "dt=2026-01-01" / f"part-{i}.jsonl").write_text('{"x": 1}\n')
    env = {
        "SLUICE_DATABASE_URL": db_url,
        "SLUICE_LANDING_DIR": str(landing),
        "SLUICE_SOURCE_NAME": "cli_backlog",
        "SLUICE_DISCOVERY_MAX_FILES_PER_TICK": "2",
    }
    first = _run(["discover"], env, tmp_path)
    assert first.returncode == 0, first.stderr
    assert "5 new splits registered in 3 ticks" in first.stdout
    second = _run(["discover"], env, tmp_path)
    assert "0 new splits registered" in second.stdout
    assert "ticks" not in second.stdout
