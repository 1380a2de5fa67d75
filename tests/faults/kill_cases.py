"""The setup the kill-schedule fault cases share (``test_exactly_once``, ``test_cdc_faults``,
``test_kafka_faults``): a Postgres server of their own per test module, the settings of their
`sluice` runs, the session that spends a kill schedule and prints its timeline, and the
fault-free runs that drain a stream source afterwards.

Each case keeps its own data, oracle and verdict; only the driving is here. Nothing here is a
fixture: each test module keeps its own module-scoped fixture around ``own_postgres``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

import pytest
from fault_harness import REPO, Chaos, Driver, OwnPostgres, log, make_root, remove, split_counts

__all__ = [
    "KINDS",
    "LEASE_SECONDS",
    "MAX_DRAIN_RUNS",
    "SEED",
    "SPARK_START",
    "chaos_session",
    "drain_stream",
    "own_postgres",
    "python_path",
    "run_settings",
    "stream_driver",
]

#: The schedule's seed (printed); ``SLUICE_FAULTS_SEED=<n>`` replays a schedule.
SEED = int(os.environ.get("SLUICE_FAULTS_SEED", "20260101"))
LEASE_SECONDS = 4.0
#: Every case delivers each of these kinds of fault at least once.
KINDS = {"worker", "driver", "postgres"}
#: A run's Spark start on a machine shared with other test suites (load 30 on 2 cores seen).
SPARK_START = 400.0
#: Fault-free runs at most to drain a stream source after its kills.
MAX_DRAIN_RUNS = 8


class _Stoppable(Protocol):
    def is_alive(self) -> bool: ...

    def stop(self) -> object: ...


@contextmanager
def own_postgres(
    request: pytest.FixtureRequest, *, logical: bool = False
) -> Iterator[tuple[OwnPostgres, Path]]:
    """A Postgres server of the module's own in a new folder (``logical``: ``wal_level =
    logical``, for CDC); the folder is kept when a test of the module failed or
    ``SLUICE_FAULTS_KEEP`` is set, else removed."""
    root = make_root()
    server = OwnPostgres(root)
    if logical:
        server.enable_logical_decoding()
    wal = " (wal_level=logical)" if logical else ""
    log(f"own Postgres{wal} in {root} ({server.url})")
    failed_before = request.session.testsfailed
    try:
        yield server, root
    finally:
        server.stop()
    if request.session.testsfailed > failed_before or os.environ.get("SLUICE_FAULTS_KEEP"):
        log(f"kept {root} (run logs under */logs, Postgres log in pg/log)")
    else:
        remove(root)


def run_settings(work: Path, db_url: str, modules: str) -> dict[str, str]:
    """The SLUICE_* settings every case's runs share: its database and folders, two local
    Spark slots, short leases and one-second checkpoints (many in flight at each kill)."""
    return {
        "SLUICE_DATABASE_URL": db_url,
        "SLUICE_PIPELINES": modules,
        "SLUICE_HOME": str(work / "home"),
        "SLUICE_DATA_DIR": str(work / "data"),
        "SLUICE_SPARK_MASTER": "local[2]",
        "SLUICE_PARALLELISM": "2",
        "SLUICE_LEASE_SECONDS": str(LEASE_SECONDS),
        "SLUICE_CHECKPOINT_INTERVAL_SECONDS": "1",
        "SLUICE_CHECKPOINT_TIMEOUT_SECONDS": "20",
    }


def python_path(*folders: Path) -> str:
    """PYTHONPATH for runs that import the case's own pipeline modules: the repository,
    ``folders``, then the caller's PYTHONPATH."""
    paths = [str(REPO), *map(str, folders), *filter(None, [os.environ.get("PYTHONPATH")])]
    return os.pathsep.join(paths)


def stream_driver(
    chaos: Chaos,
    env: dict[str, str],
    work: Path,
    server: OwnPostgres,
    db_url: str,
    pipeline: str,
    top_up: Callable[[], bool] | None = None,
) -> Driver:
    """A ``Driver`` for a stream source's runs, which may take ``SPARK_START`` to start and
    to end on a loaded machine."""
    driver = Driver(chaos, env, work, server, db_url, pipeline, LEASE_SECONDS, top_up=top_up)
    driver.start_timeout = driver.run_timeout = SPARK_START
    return driver


@contextmanager
def chaos_session(
    driver: Driver, label: str, threads: Sequence[_Stoppable] = (), *, kinds: bool = True
) -> Iterator[None]:
    """Around the runs of one case: whatever way it ends, a run still in flight is killed,
    ``threads`` (a writer, a producer, a watcher) still running are stopped and the timeline
    is printed; when it ends well, the kills and runs are logged and (``kinds``) every kind
    of fault must have been delivered."""
    chaos = driver.chaos
    started = time.monotonic()
    try:
        yield
    finally:
        driver.close()
        for thread in threads:
            if thread.is_alive():
                thread.stop()
        print(chaos.timeline(), flush=True)
    log(
        f"{label}: {len(chaos.kills)} kills, {len(chaos.runs)} runs, "
        f"{time.monotonic() - started:.1f}s"
    )
    if kinds:
        assert {kill.kind for kill in chaos.kills} == KINDS


def drain_stream(
    driver: Driver,
    discover: Callable[[], object],
    caught_up: Callable[[], bool],
    detail: Callable[[], str] = lambda: "",
) -> None:
    """Discover and run (no faults) until every split is COMPLETED and ``caught_up()`` (the
    output holds what the source held when its writer stopped); ``detail()`` ends the error
    when ``MAX_DRAIN_RUNS`` runs were not enough."""
    for _ in range(MAX_DRAIN_RUNS):
        discover()
        record = driver.finish_run(driver.start_run(), [])
        done = set(split_counts(driver.db_url, driver.pipeline)) == {"COMPLETED"}
        if done and caught_up():
            return
        if record.returncode not in (0, 3) or not done:
            time.sleep(LEASE_SECONDS + 1)  # a dead run's leases expire
    raise AssertionError(
        f"not drained after {MAX_DRAIN_RUNS} fault-free runs: "
        f"{split_counts(driver.db_url, driver.pipeline)}{detail()}"
    )
