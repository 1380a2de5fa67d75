"""A real ``dagster-daemon run`` for tests: its instance (``docker/dagster.yaml`` with SQLite
storage in a temp folder), its workspace (``docker/workspace.yaml`` on this checkout), the
``dagster`` CLI against it, and the daemon in a session of its own that ``kill`` SIGKILLs
whole — the daemon, its code server, the run workers with their Spark drivers, JVMs and
Python workers — as a restart of the daemon's container would.

Used by tests/faults/test_daemon_restart.py and tests/dagster/test_continuous_daemon.py.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import yaml

__all__ = ["BIN", "Daemon", "dagster_cli", "instance_config", "runs_of", "workspace"]

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def in_session(sid: int) -> list[psutil.Process]:
    """The processes of session ``sid`` but its leader."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.pid != sid and os.getsid(p.pid) == sid:
                found.append(p)
        except (OSError, psutil.Error):
            continue
    return found


class Daemon:
    """``dagster-daemon run`` in a session of its own (log: ``<work>/logs/daemon-<n>.log``);
    ``kill`` SIGKILLs the whole session (and any descendant that left it)."""

    def __init__(self, env: dict[str, str], work: Path, number: int) -> None:
        self.log_path = work / "logs" / f"daemon-{number}.log"
        self.log_path.parent.mkdir(exist_ok=True)
        with self.log_path.open("w") as out:
            self.proc = subprocess.Popen(
                [str(BIN / "dagster-daemon"), "run", "-w", str(work / "workspace.yaml")],
                env=env,
                cwd=work,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def processes(self) -> list[psutil.Process]:
        procs = {p.pid: p for p in in_session(self.proc.pid)}
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(self.proc.pid)
            procs[root.pid] = root
            procs.update({p.pid: p for p in root.children(recursive=True)})
        return list(procs.values())

    def kill(self) -> list[psutil.Process]:
        procs = self.processes()
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        _gone, left = psutil.wait_procs(procs, timeout=30)
        assert left == [], f"still alive after SIGKILL: {left}"
        self.proc.wait(10)
        return procs


def instance_config(home: Path) -> None:
    """docker/dagster.yaml, with SQLite storage under ``home`` (no dagster-postgres here),
    its storage created (processes started at once would race to create its tables)."""
    from dagster import DagsterInstance

    config = yaml.safe_load((REPO / "docker" / "dagster.yaml").read_text())
    config["storage"] = {"sqlite": {"base_dir": str(home / "storage")}}
    home.mkdir(parents=True)
    (home / "dagster.yaml").write_text(yaml.safe_dump(config))
    with DagsterInstance.from_config(str(home)):
        pass


def workspace(work: Path) -> None:
    """``<work>/workspace.yaml``: the deployment's code location, loaded from this checkout."""
    config = yaml.safe_load((REPO / "docker" / "workspace.yaml").read_text())
    config["load_from"][0]["python_module"]["working_directory"] = str(REPO)
    (work / "workspace.yaml").write_text(yaml.safe_dump(config))


def dagster_cli(env: dict[str, str], work: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``args[0]`` (``dagster``, ``dagster-daemon``) of the virtualenv, in ``work``."""
    return subprocess.run(
        [str(BIN / args[0]), *args[1:]],
        env=env,
        cwd=work,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def runs_of(home: Path, tags: dict[str, str]) -> list[dict[str, Any]]:
    """The runs with ``tags`` in the instance at ``home``: id, status, tags (a fresh instance
    each time: the daemon and the run workers write to the same SQLite files)."""
    from dagster import DagsterInstance, RunsFilter

    with DagsterInstance.from_config(str(home)) as instance:
        return [
            {"id": run.run_id, "status": run.status.value, "tags": dict(run.tags)}
            for run in instance.get_runs(RunsFilter(tags=tags))
        ]
