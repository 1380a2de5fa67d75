"""The Dagster home ``sluice dagster-home`` writes (``make ui``): Dagster loads it, and its run
queue holds the limits the compose deployment's ``docker/dagster.yaml`` has."""

from __future__ import annotations

from pathlib import Path

import yaml  # type: ignore[import-untyped]
from dagster import DagsterInstance
from dagster._core.run_coordinator import QueuedRunCoordinator

from dagster_project.completions import CHECKS_TAG
from dagster_project.continuous import CONTINUOUS_TAG
from spark_jobs.cli._dagster_home import DAGSTER_YAML_DEFAULTS, prepare_dagster_home

REPO = Path(__file__).resolve().parents[2]


def _per_pipeline(key: str) -> dict[str, object]:
    return {"key": key, "value": {"applyLimitPerUniqueValue": True}, "limit": 1}


def test_dagster_loads_the_home_with_the_run_queue_limits(tmp_path: Path) -> None:
    """4 runs at once, one checks' run and one continuous run per pipeline, two backfills;
    telemetry and the first-visit dialog off."""
    home = prepare_dagster_home(tmp_path / "dagster")
    with DagsterInstance.from_config(str(home)) as instance:
        coordinator = instance.run_coordinator
        assert isinstance(coordinator, QueuedRunCoordinator)
        queue = coordinator.get_run_queue_config()
        assert queue.max_concurrent_runs == 4
        assert list(queue.tag_concurrency_limits) == [
            _per_pipeline(CONTINUOUS_TAG),
            _per_pipeline(CHECKS_TAG),
            {"key": "dagster/backfill", "limit": 2},
        ]
        assert not instance.telemetry_enabled
        assert not instance.nux_enabled


def test_the_deployment_queues_runs_the_same_way() -> None:
    """The compose deployment's instance has the same run queue, block for block."""
    config = yaml.safe_load((REPO / "docker" / "dagster.yaml").read_text())
    assert config["run_coordinator"] == DAGSTER_YAML_DEFAULTS["run_coordinator"]


def test_a_run_queue_of_the_users_own_is_kept(tmp_path: Path) -> None:
    """An existing ``dagster.yaml`` with its own run coordinator keeps it; the missing blocks
    are appended."""
    home = tmp_path / "dagster"
    home.mkdir()
    own = (
        "run_coordinator:\n"
        "  module: dagster._core.run_coordinator\n"
        "  class: DefaultRunCoordinator\n"
    )
    (home / "dagster.yaml").write_text(own)
    prepare_dagster_home(home)
    written = (home / "dagster.yaml").read_text()
    assert written.startswith(own)
    assert yaml.safe_load(written)["telemetry"] == {"enabled": False}
    with DagsterInstance.from_config(str(home)) as instance:
        assert not isinstance(instance.run_coordinator, QueuedRunCoordinator)
