"""The ``sluice/run_id`` run tag and the partition key of a Dagster run cannot lead a path out
of the warehouse (issue 13): anyone who can launch a run can set the tag, and it names the
run's staging folder (``shutil.rmtree(staging / run_id)``).

A run with a hostile tag fails with one line naming the tag, before anything is discovered or
written; nothing outside the data root is created or deleted.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import date
from pathlib import Path

import pytest
from conftest import TestSettings
from dagster import DagsterError, DagsterInstance, materialize
from dagster_support import incremental_job_of
from hostile_inputs import HOSTILE, tree
from sluice_resource import resource_for

from dagster_project import pipeline_definitions
from dagster_project._runs import SLUICE_RUN_TAG
from spark_jobs import FileSource, ParquetSink, Pipeline

#: The values of ``HOSTILE`` tried against the run tag (path-shaped ones).
TAG_VALUES = {
    key: HOSTILE[key]
    for key in ("slash", "dotdot", "climb", "up-two", "nul", "long", "empty", "absolute")
}


def _pipeline(partitioned: bool) -> Pipeline:
    return Pipeline(
        name="tagpaths",
        source=FileSource(
            landing="landing/tagpaths",
            schema={"x": "int64", "t": "timestamp"},
            event_time="t" if partitioned else None,
            partition_by="day" if partitioned else None,
            start_date=date(2026, 1, 1),
        ),
        sink=ParquetSink("tagpaths"),
    )


@pytest.fixture
def platform(
    make_settings: Callable[..., TestSettings], tmp_path: Path
) -> tuple[TestSettings, Path]:
    settings = make_settings(home=tmp_path / "root" / "home", data_dir=tmp_path / "root" / "data")
    staging = settings.warehouse_path / "_staging" / "tagpaths"
    staging.mkdir(parents=True)
    (settings.data_path / "landing" / "tagpaths").mkdir(parents=True)
    (settings.data_path / "sentinel.txt").write_text("keep me")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "victim.txt").write_text("keep me too")
    return settings, tmp_path


def _assert_untouched(base: Path, before: dict[str, bytes | None]) -> None:
    after = tree(base)
    assert {k: after.get(k) for k in before} == before
    created = sorted(set(after) - set(before))
    assert all(Path(k).parts[0] == "root" for k in created), created


@pytest.mark.parametrize("value", TAG_VALUES.values(), ids=TAG_VALUES.keys())
def test_a_hostile_run_tag_fails_the_run_before_anything_moves(
    platform: tuple[TestSettings, Path], tmp_path: Path, value: str
) -> None:
    settings, base = platform
    built = pipeline_definitions(_pipeline(partitioned=False), settings)
    before = tree(base)
    with DagsterInstance.ephemeral() as instance:
        asset = materialize(
            [built.output],
            tags={SLUICE_RUN_TAG: value},
            resources={"sluice": resource_for(settings)},
            instance=instance,
            raise_on_error=False,
        )
        job = incremental_job_of(built, settings).execute_in_process(
            tags={SLUICE_RUN_TAG: value},
            resources={"sluice": resource_for(settings)},
            instance=instance,
            raise_on_error=False,
        )
    for result in (asset, job):
        assert not result.success
        (failure,) = [e for e in result.all_events if e.is_step_failure]
        error, messages = failure.step_failure_data.error, []
        while error is not None:  # Dagster wraps the op's error
            messages.append(error.message.strip())
            error = error.cause
        ours = f"enumerator_service._config.ConfigError: run tag {SLUICE_RUN_TAG}: "
        (message,) = [m for m in messages if m.startswith(ours)]
        assert len(message.splitlines()) == 1 and len(message) < 200, message
    _assert_untouched(base, before)


@pytest.mark.parametrize("key", ["..", "a/../../b", "/", "2026-01-01/..", "r" * 5000, ""])
def test_a_hostile_partition_key_never_reaches_a_path(
    platform: tuple[TestSettings, Path], key: str
) -> None:
    """Dagster refuses keys its partitions do not have; Sluice's own check (one line naming
    the key) is behind it for a key that comes another way."""
    settings, base = platform
    built = pipeline_definitions(_pipeline(partitioned=True), settings)
    before = tree(base)
    with DagsterInstance.ephemeral() as instance, pytest.raises(DagsterError) as caught:
        materialize(
            [built.output],
            partition_key=key,
            resources={"sluice": resource_for(settings)},
            instance=instance,
        )
    assert "partition" in str(caught.value).lower()
    _assert_untouched(base, before)
