"""A real Spark standalone cluster for tests: one master and one worker started from the
pyspark wheel's ``bin/spark-class`` on 127.0.0.1, with ``spark.authenticate`` on.

The shared secret reaches the daemons through a properties file (``--properties-file``, mode
600), not through ``-D`` options that ``ps`` would show. Both daemons run in process groups
of their own (the worker's executors are in the worker's group); :meth:`StandaloneCluster.stop`
kills every process of those sessions, also when the test failed.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pyspark

SPARK_HOME = Path(pyspark.__file__).parent
START_TIMEOUT = 60.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class StandaloneCluster:
    """Master + one worker with ``cores`` cores; ``worker_env`` is added to the worker's
    environment (its executors inherit it); ``worker_cwd``: the worker's working directory
    (default: the caller's; its executors run in their folders under ``root/work``)."""

    def __init__(
        self,
        root: Path,
        *,
        cores: int = 2,
        worker_env: dict[str, str],
        worker_cwd: Path | None = None,
    ) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.secret = secrets.token_hex(16)
        #: The secret alone (SLUICE_SPARK_AUTH_SECRET_FILE of the driver).
        self.secret_file = root / "spark-secret"
        self.secret_file.write_text(self.secret + "\n")
        self.secret_file.chmod(0o600)
        properties = root / "spark-daemons.conf"
        properties.write_text(f"spark.authenticate true\nspark.authenticate.secret {self.secret}\n")
        properties.chmod(0o600)
        self.port, self.ui_port = free_port(), free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self._procs: list[subprocess.Popen[bytes]] = []
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("SLUICE_", "PYSPARK_"))},
            "SPARK_HOME": str(SPARK_HOME),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOCAL_DIRS": str(root / "local"),
            "SPARK_LOG_DIR": str(root / "logs"),
            "TMPDIR": str(root / "local"),
        }
        (root / "local").mkdir(exist_ok=True)
        (root / "logs").mkdir(exist_ok=True)
        spark_class = str(SPARK_HOME / "bin" / "spark-class")
        try:
            self._start(
                "master",
                [
                    spark_class,
                    "org.apache.spark.deploy.master.Master",
                    *("--host", "127.0.0.1", "--port", str(self.port)),
                    *("--webui-port", str(self.ui_port), "--properties-file", str(properties)),
                ],
                env,
            )
            self._start(
                "worker",
                [
                    spark_class,
                    "org.apache.spark.deploy.worker.Worker",
                    self.url,
                    *("--cores", str(cores), "--memory", "2g", "--host", "127.0.0.1"),
                    *("--webui-port", str(free_port()), "--work-dir", str(root / "work")),
                    *("--properties-file", str(properties)),
                ],
                {**env, "PYSPARK_PYTHON": sys.executable, **worker_env},
                cwd=worker_cwd,
            )
            self._wait_for_worker()
        except BaseException:
            self.stop()
            raise

    def _start(
        self, name: str, argv: list[str], env: dict[str, str], cwd: Path | None = None
    ) -> None:
        log = (self.root / "logs" / f"{name}.out").open("wb")
        self._procs.append(
            subprocess.Popen(
                argv,
                env=env,
                cwd=cwd,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        log.close()

    def state(self) -> dict[str, object]:
        """The master's JSON status (workers, applications)."""
        with urllib.request.urlopen(
            f"http://127.0.0.1:{self.ui_port}/json/", timeout=5
        ) as response:
            state: dict[str, object] = json.load(response)
            return state

    def _wait_for_worker(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            for proc in self._procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"a Spark daemon exited: see {self.root / 'logs'}")
            with contextlib.suppress(OSError, ValueError):
                workers = self.state().get("workers")
                if isinstance(workers, list) and any(w.get("state") == "ALIVE" for w in workers):
                    return
            time.sleep(0.5)
        raise RuntimeError(f"no worker registered within {START_TIMEOUT:.0f} s")

    def executors(self) -> list[psutil.Process]:
        """The worker's executor JVMs (CoarseGrainedExecutorBackend) alive now."""
        found = []
        for proc in self._sessions():
            with contextlib.suppress(psutil.Error):
                if proc.status() != psutil.STATUS_ZOMBIE and any(
                    "CoarseGrainedExecutorBackend" in part for part in proc.cmdline()
                ):
                    found.append(proc)
        return found

    def _sessions(self) -> list[psutil.Process]:
        sessions = {proc.pid for proc in self._procs}
        found = []
        for proc in psutil.process_iter():
            with contextlib.suppress(OSError, psutil.Error):
                if os.getsid(proc.pid) in sessions:
                    found.append(proc)
        return found

    def stop(self) -> None:
        """Kill the daemons and everything they started (executors, Python workers)."""
        leftovers = self._sessions()
        for proc in self._procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        for proc in leftovers:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        for proc in self._procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(30)
        psutil.wait_procs(leftovers, timeout=30)
