"""A connector written outside the platform (issue 22, part 5): the generator source of
``tests/connectors/generator.py``, registered from its own module with ``register_source``
(no platform code names it), run through the CLI and through Dagster; the third run, a
SIGKILL and a rerun, is ``tests/faults/test_external_connector_faults.py``. Each is checked
against an oracle computed from the generator's documented definition
(``tests/connectors/oracle.py``): output == oracle, duplicates = 0, missing = 0, every dead
letter once.

1. the CLI: ``sluice pipelines``, ``sluice discover`` (continuous ticks of at most 3 splits,
   the one-integer cursor persisted between them), ``sluice run``, ``sluice status``, as
   subprocesses with ``SLUICE_PIPELINES=tests.connectors.generator_pipeline``;
2. Dagster: ``materialize()`` of one day of the pipeline's output asset with its checks
   (bounded discovery of that day only; the other day is neither registered nor read).

Each test has a database of its own (splits, cursor and output never meet another's).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from conftest import load_test_settings
from dagster import DagsterInstance, materialize
from sluice_resource import resource_for

from dagster_project import pipeline_definitions
from tests.connectors.generator_pipeline import generated
from tests.connectors.oracle import (
    FIRST_DAY,
    REPO,
    assert_exactly_once,
    cli_env,
    cursor_of,
    ok,
    oracle,
    own_database,
    sluice,
    split_progress,
)

pytestmark = pytest.mark.spark


@pytest.fixture
def own_db(server_url: str) -> Iterator[str]:
    with own_database(server_url) as url:
        yield url


# `extended` (CI's 30-minute budget: `make faults` runs it, `make test` leaves it out).
@pytest.mark.extended
def test_cli_discover_run_and_status_are_the_oracle(own_db: str, tmp_path: Path) -> None:
    env = cli_env(own_db, tmp_path, SLUICE_DISCOVERY_MAX_FILES_PER_TICK="3")
    listed = ok(sluice(env, tmp_path, "pipelines"))
    assert "generated events, seed 7: 2 days from 2026-05-01" in listed, listed
    # 8 splits (2 days of 4), at most 3 a tick: three continuous ticks, the cursor between
    # them one integer (the next sequence number).
    found = ok(sluice(env, tmp_path, "discover", "generated"))
    assert "8 new splits registered in 3 ticks" in found, found
    assert cursor_of(own_db, "generated") == {"next": 2000}
    assert [(a, b) for a, b, *_ in split_progress(own_db, "generated")] == [
        (n, n + 250) for n in range(0, 2000, 250)
    ]
    ran = ok(sluice(env, tmp_path, "run", "generated"))
    expected = oracle(per_day=1000, days=[0, 1])
    output = tmp_path / "data" / "warehouse" / "generated"
    assert_exactly_once(expected, output, own_db, "generated")
    status = json.loads(ok(sluice(env, tmp_path, "status", "generated", "--json")))
    counts = status["pipelines"]["generated"]
    assert counts["splits"]["COMPLETED"] == 8, (counts, ran)
    assert counts["rows_committed"] == len(expected.rows)
    assert counts["rows_removed_by_steps"] == expected.removed
    assert counts["dead_letters"] == len(expected.dead_letters)
    assert counts["dead_letter_reasons"] == {"missing field": len(expected.dead_letters)}
    assert counts["failed_splits"] == []


def test_dagster_materialize_of_one_day_is_the_oracle(
    own_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The Spark workers of this process import the connector module (a JVM started now
    # passes this on to them; the pyspark daemon runs from the repository anyway).
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
    assert built.output.partitions_def.get_first_partition_key() == FIRST_DAY.isoformat()
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
    assert set(checks) >= {"unique_key", "rows_reconcile", "dead_letter_ratio"}, checks
    assert all(checks.values()), checks
    # Only that day was discovered (bounded: its 4 splits) and read.
    assert {a // 1000 for a, *_ in split_progress(own_db, generated.name)} == {1}
    expected = oracle(per_day=1000, days=[1])
    folder = settings.warehouse_path / generated.name
    assert_exactly_once(expected, folder, own_db, generated.name)
    assert sorted(p.name for p in folder.iterdir() if p.name.startswith("dt=")) == [
        f"dt={day.isoformat()}"
    ]
