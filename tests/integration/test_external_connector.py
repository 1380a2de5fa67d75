"""A connector written outside the platform (issue 22, part 5): the generator source of
``tests/connectors/generator.py``, registered from its own module with ``register_source``,
run the three ways a pipeline runs — each checked against an oracle computed here from the
generator's documented definition (not with its code): output == oracle, no duplicate, none
missing, every dead letter once.

1. the CLI: ``sluice discover`` (continuous ticks of at most 3 splits, the cursor persisted
   between them) then ``sluice run``, as subprocesses with
   ``SLUICE_PIPELINES=tests.connectors.generator_pipeline``;
2. Dagster: ``materialize()`` of one day of the pipeline's output asset (bounded discovery
   of that day only) with its checks;
3. a fault: ``sluice run`` of the paced pipeline SIGKILLed (driver and JVM) once a checkpoint
   committed part of a split, then run again: it resumes each split from its committed
   offset, exactly once.

Each test has a database of its own (its splits, cursor and output never meet another's).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import psutil
import pyarrow.dataset as ds
import pytest
import sqlalchemy as sa
from conftest import load_test_settings
from dagster import DagsterInstance, materialize
from dagster_daemon import in_session
from sluice_resource import resource_for
from sqlalchemy.engine import make_url

from dagster_project import pipeline_definitions
from enumerator_service import connect_engine, upgrade_schema
from enumerator_service._schema import dead_letters, splits
from tests.connectors.generator_pipeline import generated

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
SLUICE = Path(sys.executable).with_name("sluice")
MODULE = "tests.connectors.generator_pipeline"
FIRST_DAY = date(2026, 5, 1)
COLUMNS = ["event_id", "user_id", "event_type", "amount", "event_time", "amount_cents", "dt"]


# --------------------------------------------------------------------------- the oracle


@dataclass(frozen=True)
class Oracle:
    rows: dict[str, tuple[Any, ...]]
    dead_letters: set[int]
    #: Records the Filter removes (views).
    removed: int


def oracle(*, per_day: int, days: list[int], seed: int = 7) -> Oracle:
    """What the output of ``days`` (indices from FIRST_DAY) must be, from the generator's
    definition: record n of day n // per_day; a null (required) user every 101st record; the
    pipeline keeps the events that are not views and adds the amount in cents."""
    rows: dict[str, tuple[Any, ...]] = {}
    dead: set[int] = set()
    removed = 0
    step = 86_400_000_000 // per_day
    for day in days:
        midnight = datetime(FIRST_DAY.year, FIRST_DAY.month, FIRST_DAY.day, tzinfo=UTC)
        midnight += timedelta(days=day)
        for n in range(day * per_day, (day + 1) * per_day):
            if n % 101 == 100:
                dead.add(n)
                continue
            kind = ("view", "click", "purchase")[n % 3]
            if kind == "view":
                removed += 1
                continue
            cents = (n * 7 + seed) % 20_000 - 5_000  # the Map's round(amount * 100)
            when = midnight + timedelta(microseconds=(n % per_day) * step + (n * 7919 + seed) % step)
            event_id = f"g{seed}-{n:07d}"
            rows[event_id] = (
                event_id,
                (n * 31 + seed) % 97,
                kind,
                ((n * 7 + seed) % 20_000) / 100 - 50,
                when,
                cents,
                (FIRST_DAY + timedelta(days=day)).isoformat(),
            )
    return Oracle(rows, dead, removed)


def output_rows(folder: Path) -> list[tuple[Any, ...]]:
    """Every row of the pipeline's Parquet output (all ``dt=`` folders), in COLUMNS order."""
    if not folder.exists():
        return []
    table = ds.dataset(folder, format="parquet", partitioning="hive").to_table()
    return [
        tuple(str(r[c]) if c == "dt" else r[c] for c in COLUMNS) for r in table.to_pylist()
    ]


def dead_letter_offsets(db_url: str, source: str) -> list[int]:
    engine = connect_engine(db_url, pool_size=1)
    try:
        with engine.connect() as conn:
            found = conn.execute(
                sa.select(dead_letters.c.offset).where(dead_letters.c.source == source)
            )
            return [int(n) for n in found.scalars()]
    finally:
        engine.dispose()


def assert_exactly_once(expected: Oracle, folder: Path, db_url: str, source: str) -> None:
    """Output == oracle (each row once, with its values), dead letters == oracle's, once."""
    rows = output_rows(folder)
    keys = [row[0] for row in rows]
    duplicates = len(keys) - len(set(keys))
    missing = expected.rows.keys() - set(keys)
    extra = set(keys) - expected.rows.keys()
    assert (duplicates, len(missing), len(extra)) == (0, 0, 0), (
        f"duplicates={duplicates} missing={len(missing)} (e.g. {sorted(missing)[:3]}) "
        f"extra={len(extra)} (e.g. {sorted(extra)[:3]})"
    )
    different = [row for row in rows if expected.rows[row[0]] != row]
    assert not different, f"{len(different)} rows differ: {different[0]} != " + str(
        expected.rows[different[0][0]]
    )
    dead = dead_letter_offsets(db_url, source)
    assert len(dead) == len(set(dead)) and set(dead) == expected.dead_letters


# --------------------------------------------------------------------------- the platform


@pytest.fixture
def own_db(server_url: str) -> Iterator[str]:
    """A database of this test's own, migrated to head."""
    name = f"sluice_extconn_{secrets.token_hex(4)}"
    admin = sa.create_engine(
        make_url(server_url).set(drivername="postgresql+psycopg"), isolation_level="AUTOCOMMIT"
    )
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
    engine = connect_engine(url, pool_size=1)
    try:
        upgrade_schema(engine)
    finally:
        engine.dispose()
    yield url
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def cli_env(db_url: str, root: Path, **extra: str) -> dict[str, str]:
    """The environment of a ``sluice`` subprocess: the repository on ``PYTHONPATH`` (the
    driver imports the pipeline module, the Spark workers the connector module)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    tmp = root / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    env.update(
        SLUICE_DATABASE_URL=db_url,
        SLUICE_HOME=str(root / "home"),
        SLUICE_DATA_DIR=str(root / "data"),
        SLUICE_PIPELINES=MODULE,
        SLUICE_SPARK_MASTER="local[2]",
        SLUICE_PARALLELISM="2",
        SLUICE_CHECKPOINT_INTERVAL_SECONDS="1",
        PYTHONPATH=os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
        PYSPARK_PYTHON=sys.executable,
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_LOCAL_DIRS=str(tmp),
        COLUMNS="200",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def sluice(env: dict[str, str], root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    started = time.monotonic()
    try:
        return _sluice(env, root, *args)
    finally:
        print(f"sluice {' '.join(args)}: {time.monotonic() - started:.1f} s")


def _sluice(env: dict[str, str], root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SLUICE), *args],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, f"{done.args} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


# --------------------------------------------------------------------------- 1. the CLI


def test_cli_discover_and_run_is_the_oracle(own_db: str, tmp_path: Path) -> None:
    env = cli_env(own_db, tmp_path, SLUICE_DISCOVERY_MAX_FILES_PER_TICK="3")
    listed = ok(sluice(env, tmp_path, "pipelines"))
    assert "generated events, seed 7: 2 days from 2026-05-01" in listed, listed
    # 8 splits (2 days of 4), at most 3 a tick: three continuous ticks, the cursor between.
    found = ok(sluice(env, tmp_path, "discover", "generated"))
    assert "8 new splits registered in 3 ticks" in found, found
    assert "0 new splits registered" in ok(sluice(env, tmp_path, "discover", "generated"))
    ran = ok(sluice(env, tmp_path, "run", "generated"))
    expected = oracle(per_day=1000, days=[0, 1])
    assert_exactly_once(expected, tmp_path / "data" / "warehouse" / "generated", own_db, "generated")
    status = json.loads(ok(sluice(env, tmp_path, "status", "generated", "--json")))
    counts = status.get("pipelines", status)["generated"]
    assert counts["splits"]["COMPLETED"] == 8, (counts, ran)
    assert counts["rows_committed"] == len(expected.rows)
    assert counts["rows_removed_by_steps"] == expected.removed
    assert counts["dead_letters"] == len(expected.dead_letters)
    assert counts["dead_letter_reasons"] == {"missing field": len(expected.dead_letters)}
    assert counts["failed_splits"] == []


# --------------------------------------------------------------------------- 2. Dagster


def test_dagster_materialize_of_one_day_is_the_oracle(
    own_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The Spark workers of this process import the connector module: the repository first.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    settings = load_test_settings(
        database_url=own_db,
        home=tmp_path / "home",
        data_dir=tmp_path / "data",
        source_name=generated.name,
        spark_master="local[2]",
        parallelism=2,
        checkpoint_interval_seconds=1.0,
    )
    built = pipeline_definitions(generated, settings)
    assert built.output.partitions_def is not None
    assert built.output.partitions_def.get_first_partition_key() == "2026-05-01"
    day = FIRST_DAY + timedelta(days=1)
    (tmp_path / "dagster").mkdir()
    with DagsterInstance.local_temp(str(tmp_path / "dagster")) as instance:
        result = materialize(
            [built.output, *built.checks],
            partition_key=day.isoformat(),
            resources={"sluice": resource_for(settings)},
            instance=instance,
        )
    assert result.success
    events = result.asset_materializations_for_node(generated.name)
    assert [e.partition for e in events] == [day.isoformat()]
    checks = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    assert checks and all(checks.values()), checks
    # Only that day was discovered (bounded) and read.
    expected = oracle(per_day=1000, days=[1])
    folder = settings.warehouse_path / generated.name
    assert_exactly_once(expected, folder, own_db, generated.name)
    assert sorted(p.name for p in folder.iterdir() if p.name.startswith("dt=")) == [
        f"dt={day.isoformat()}"
    ]


# --------------------------------------------------------------------------- 3. a fault


def _split_progress(db_url: str, source: str) -> list[tuple[int, int, int | None, str]]:
    engine = connect_engine(db_url, pool_size=1)
    try:
        with engine.connect() as conn:
            c = splits.c
            found = conn.execute(
                sa.select(c.start_offset, c.end_offset, c.committed_offset, c.status)
                .where(c.source == source)
                .order_by(c.start_offset)
            )
            return [(int(a), int(b), c, str(s)) for a, b, c, s in found.all()]
    finally:
        engine.dispose()


def _wait_for_a_partial_commit(
    proc: subprocess.Popen[str], db_url: str, source: str, timeout: float
) -> list[tuple[int, int, int | None, str]]:
    """Once a checkpoint committed part of a split (start < committed offset < end): the
    splits then."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        progress = _split_progress(db_url, source)
        if any(c is not None and a < c < b for a, b, c, _ in progress):
            return progress
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    raise AssertionError(f"no split was committed part-way (run exit {proc.poll()})")


def _kill_run(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the run's process group (Python driver + JVM); the Spark daemon and its
    workers (their own group, same session) follow it, or are killed after 20 s."""
    others = in_session(proc.pid)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
    _gone, alive = psutil.wait_procs([p for p in others if p.is_running()], timeout=20)
    for p in alive:
        p.kill()


@pytest.mark.faults
def test_a_killed_run_resumes_from_its_checkpoint_exactly_once(
    own_db: str, tmp_path: Path
) -> None:
    source = "generated_paced"
    env = cli_env(own_db, tmp_path, SLUICE_LEASE_SECONDS="4")
    ok(sluice(env, tmp_path, "discover", source))
    log = (tmp_path / "run-1.log").open("w")
    proc = subprocess.Popen(
        [str(SLUICE), "run", source],
        env=env,
        cwd=tmp_path,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        at_kill = _wait_for_a_partial_commit(proc, own_db, source, timeout=120)
        _kill_run(proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        log.close()
    assert not all(s == "COMPLETED" for *_, s in at_kill), "the run ended before the kill"
    expected = oracle(per_day=2000, days=[0, 1])
    folder = tmp_path / "data" / "warehouse" / source
    assert len(output_rows(folder)) < len(expected.rows)
    # The dead run's leases expire (4 s); the next run takes its splits from their committed
    # offsets. A run that started while a lease was still held leaves that split (exit 4).
    for _attempt in range(4):
        done = sluice(env, tmp_path, "run", source)
        assert done.returncode in (0, 4), f"{done.stdout}\n{done.stderr}"
        if all(s == "COMPLETED" for *_, s in _split_progress(own_db, source)):
            break
        time.sleep(2)
    assert_exactly_once(expected, folder, own_db, source)
