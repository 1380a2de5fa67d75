"""Sensor ticks never migrate: on a platform database at an older schema revision, each
discovery sensor's tick fails with the one line saying what to do, and registers nothing.

(A failed tick, not a SkipReason: Dagster shows a failed tick in red in the UI and logs it in
the daemon; a skipped one reads as "nothing new" and would hide that discovery has stopped.)

No ``__init__.py`` in this folder on purpose (see test_definitions.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from conftest import TestSettings
from dagster import DagsterInstance
from dagster_support import demo_definitions, sensor_named, sensor_tick
from schema_versions import OLD_REVISION, database_at, revision_of
from sluice_resource import resource_for

from enumerator_service import ConfigError, SchemaError, connect_engine
from enumerator_service._database import head_revision

MakeSettings = Callable[..., TestSettings]


@pytest.fixture
def old_db(server_url: str) -> Iterator[str]:
    with database_at(server_url, OLD_REVISION) as url:
        yield url


def _split_count(url: str) -> int:
    engine = connect_engine(url, pool_size=1)
    try:
        with engine.connect() as conn:
            return int(conn.execute(sa.text("SELECT count(*) FROM sluice.splits")).scalar_one())
    finally:
        engine.dispose()


@pytest.mark.parametrize("sensor", ["new_files", "continuous"])
def test_a_sensor_tick_on_an_older_schema_fails_with_what_to_do(
    make_settings: MakeSettings, old_db: str, sensor: str
) -> None:
    settings = make_settings(database_url=old_db)
    (settings.landing_path / "dt=2026-01-01").mkdir(parents=True)
    (settings.landing_path / "dt=2026-01-01" / "part-0.jsonl").write_text('{"event_id": "e"}\n')
    built = demo_definitions(settings)
    expected = (
        f"the platform database schema is at revision {OLD_REVISION}, this Sluice needs "
        f"{head_revision()} — run 'sluice db upgrade'"
    )
    with DagsterInstance.ephemeral() as instance, pytest.raises(SchemaError) as raised:
        sensor_tick(sensor_named(built, sensor), resource_for(settings), None, instance)
    assert str(raised.value) == expected
    assert revision_of(old_db) == OLD_REVISION
    assert _split_count(old_db) == 0


def test_an_asset_checks_counts_on_an_older_schema_say_what_to_do(
    make_settings: MakeSettings, old_db: str
) -> None:
    from demo_platform import demo_pipeline

    from dagster_project._counts import partition_counts

    settings = make_settings(database_url=old_db)
    with pytest.raises(SchemaError, match=r"run 'sluice db upgrade'$"):
        partition_counts(demo_pipeline(settings), settings, [None])
    assert revision_of(old_db) == OLD_REVISION


def test_checks_never_create_an_embedded_database(
    make_settings: MakeSettings, tmp_path: Path
) -> None:
    from demo_platform import demo_pipeline

    from dagster_project._counts import partition_counts

    home = tmp_path / "elsewhere"
    settings = make_settings(database_url=None, home=home)
    with pytest.raises(ConfigError, match=r"^SLUICE_HOME: no Sluice database at "):
        partition_counts(demo_pipeline(settings), settings, [None])
    assert not (home / "pg").exists()
