"""Acceptance of issue 21 (3): under a real ``dagster-daemon``, a continuous run over sparse
input completes its days while it is alive, and Dagster shows them materialised then.

A user's own pipeline (a module of the test's, named by ``SLUICE_PIPELINES``), two subtasks,
one small file per day. The daemon's ``<pipeline>_continuous`` sensor registers the first two
days and requests the run; once the run has read them, the third day's file lands and the next
tick assigns it to the live run. Each file is read between two barriers, so the subtasks are
idle at nearly every barrier — the shape in which the run watermark stayed NULL and no day
completed (issue 21). The reporter sensor then materialises days 1 and 2 while the run is
still STARTED; day 3's event time has not passed, so it is not complete.

Real Postgres (the suite's), a real daemon launching the run (local Spark) with the instance
of docker/dagster.yaml on SQLite. No ``__init__.py`` in this folder on purpose (see
test_definitions.py).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
import sqlalchemy as sa
from conftest import TestSettings
from dagster_daemon import Daemon, dagster_cli, instance_config, runs_of, workspace

from enumerator_service._operations import open_platform
from enumerator_service._schema import partition_completions, splits

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

D1, D2, D3 = (date(2026, 4, 1) + timedelta(days=i) for i in range(3))
#: No single wait may exceed this (Spark's start on a busy machine included).
WAIT = 150.0

PIPELINE_MODULE = """
from spark_jobs import FileSource, Map, ParquetSink, Pipeline


def unchanged(batch):
    return batch


sparse = Pipeline(
    name={name!r},
    source=FileSource(
        schema={{"id": "string", "at": "timestamp"}},
        required=["id", "at"],
        event_time="at",
        out_of_orderness="1s",
    ),
    steps=[Map(unchanged)],
    sink=ParquetSink({name!r} + "_out"),
    key=["id"],
)
"""


def _wait(what: str, condition: Callable[[], bool], timeout: float = WAIT) -> None:
    started = time.monotonic()
    while not condition():
        assert time.monotonic() < started + timeout, f"timed out waiting for {what}"
        time.sleep(1)
    print(f"[{time.strftime('%H:%M:%S')}] {what} after {time.monotonic() - started:.1f}s")


def _land(landing: Path, day: date) -> None:
    """One small file of ``day``: three records, early, midday and late in the day."""
    folder = landing / f"dt={day}"
    folder.mkdir(parents=True)
    start = datetime.combine(day, datetime.min.time(), tzinfo=UTC)
    lines = [
        orjson.dumps({"id": f"{day}-{h}", "at": (start + timedelta(hours=h)).isoformat()})
        for h in (0.5, 12, 23.5)
    ]
    (folder / "events.jsonl").write_bytes(b"\n".join(lines) + b"\n")


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[list[Daemon]]:
    """Every daemon the test starts, SIGKILLed whole at the end (its run and Spark too)."""
    started: list[Daemon] = []
    try:
        yield started
    finally:
        for daemon in started:
            daemon.kill()


# `extended` (CI's 30-minute budget: `make faults` runs it, `make test` leaves it out).
@pytest.mark.extended
def test_a_sparse_continuous_run_under_the_daemon_materialises_its_days_while_alive(
    make_settings: Callable[..., TestSettings], tmp_path: Path, daemons: list[Daemon]
) -> None:
    settings = make_settings()
    name = settings.source_name
    module = f"user_{name}"
    code = tmp_path / "code"
    code.mkdir()
    (code / f"{module}.py").write_text(PIPELINE_MODULE.format(name=name))
    home = tmp_path / "dagster_home"
    instance_config(home)
    workspace(tmp_path)
    assert settings.database_url is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    env.update(
        DAGSTER_HOME=str(home),
        PYTHONPATH=os.pathsep.join([str(code), env.get("PYTHONPATH", "")]),
        PYSPARK_PYTHON=sys.executable,
        SPARK_LOCAL_IP="127.0.0.1",
        SLUICE_DATABASE_URL=settings.database_url.get_secret_value(),
        SLUICE_PIPELINES=module,
        SLUICE_HOME=str(settings.home),
        SLUICE_DATA_DIR=str(settings.data_dir),
        SLUICE_SPARK_MASTER="local[2]",
        SLUICE_PARALLELISM="2",
        SLUICE_CHECKPOINT_INTERVAL_SECONDS="0.5",
        SLUICE_CONTINUOUS_POLL_SECONDS="0.3",
        # Every subtask stays open for the whole test (idle at the barriers, not ended).
        SLUICE_CONTINUOUS_IDLE_SECONDS="600",
    )
    platform = open_platform(settings)
    landing = settings.data_path / "landing" / name
    _land(landing, D1)
    _land(landing, D2)

    def completed() -> set[date]:
        with platform.engine.connect() as conn:
            return set(
                conn.execute(
                    sa.select(partition_completions.c.partition_key).where(
                        partition_completions.c.source == name
                    )
                ).scalars()
            )

    def read(*days: date) -> bool:
        with platform.engine.connect() as conn:
            states = conn.execute(
                sa.select(splits.c.partition_key, splits.c.status).where(splits.c.source == name)
            ).all()
        return {d for d, s in states if s == "COMPLETED"} >= set(days)

    def live_run() -> dict[str, Any] | None:
        runs = runs_of(home, {"sluice/mode": "continuous"})
        return runs[0] if runs and runs[0]["status"] == "STARTED" else None

    def materialised() -> set[str]:
        from dagster import AssetKey, DagsterInstance

        with DagsterInstance.from_config(str(home)) as instance:
            return set(instance.get_materialized_partitions(AssetKey(name)))

    try:
        # The daemon loads its code location while the CLI turns the sensor on.
        daemons.append(Daemon(env, tmp_path, 1))
        turned_on = dagster_cli(
            env,
            tmp_path,
            "dagster",
            "sensor",
            "start",
            f"{name}_continuous",
            "-w",
            "workspace.yaml",
        )
        assert turned_on.returncode == 0, turned_on.stderr
        _wait("the continuous run STARTED", lambda: live_run() is not None)
        # Day 3 lands while the run lives; a later tick assigns it to the run.
        _land(landing, D3)
        _wait("days 1-3 read by the live run", lambda: read(D1, D2, D3))
        # Each file was read between two barriers: the subtasks are idle at the barriers.
        _wait("days 1 and 2 complete", lambda: completed() >= {D1, D2}, timeout=60)
        assert live_run() is not None, "the run ended"
        _wait("days 1 and 2 materialised in Dagster", lambda: materialised() >= {str(D1), str(D2)})
        assert live_run() is not None, "the run ended before Dagster showed its days"
        assert D3 not in completed()  # its event time has not passed
        assert str(D3) not in materialised()
    except AssertionError:
        log = daemons[0].log_path.read_text()[-4000:] if daemons else ""
        print(log)
        raise
    finally:
        platform.close()
