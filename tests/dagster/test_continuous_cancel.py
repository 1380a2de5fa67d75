"""Cancelling a live continuous run the way Dagster does (real Dagster, real Postgres, real
local Spark): ``terminateRun`` makes the run's process send itself SIGINT from Dagster's
termination thread (``dagster_shared.ipc.send_interrupt``) while the op waits in Spark's
job; the op must stop its Spark job, give its splits back and end the run as interrupted
within seconds — not keep checkpointing.

No ``__init__.py`` in this folder on purpose (see test_definitions.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import TestSettings
from dagster import DagsterInstance, DagsterRunStatus, RunRequest, RunsFilter
from dagster_shared.ipc import send_interrupt
from dagster_support import demo_definitions, sensor_named, sensor_tick, split_counts
from demo_platform import prepare_demo
from sluice_resource import resource_for

from dagster_project.continuous import SLUICE_RUN_TAG
from enumerator_service._operations import open_platform

MakeSettings = Callable[..., TestSettings]
CANCEL_SECONDS = 45.0  # cancelAllJobs + the tasks' drain (at most 20 s) + the run's cleanup


def test_an_interrupted_continuous_run_stops_its_spark_job_and_gives_its_splits_back(
    make_settings: MakeSettings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    settings = make_settings(demo_events=200, demo_users=50, demo_days=1)
    monkeypatch.setenv("SLUICE_CHECKPOINT_INTERVAL_SECONDS", "0.5")
    monkeypatch.setenv("SLUICE_CONTINUOUS_POLL_SECONDS", "0.2")
    monkeypatch.setenv("SLUICE_CONTINUOUS_IDLE_SECONDS", "3600")  # it never ends by itself
    platform = open_platform(settings)
    try:
        prepare_demo(settings, platform)
    finally:
        platform.close()
    built, source = demo_definitions(settings), settings.source_name
    sluice = resource_for(settings)
    with DagsterInstance.local_temp(str(tmp_path)) as instance:
        request, _cursor = sensor_tick(sensor_named(built, "continuous"), sluice, None, instance)
        assert isinstance(request, RunRequest)
        sent: dict[str, float] = {}

        def terminate() -> None:  # Dagster's termination thread, once the run is reading
            mine = RunsFilter(tags={SLUICE_RUN_TAG: request.tags[SLUICE_RUN_TAG]})
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline:
                started = any(r.status == DagsterRunStatus.STARTED for r in instance.get_runs(mine))
                if started and split_counts(settings, source).get("COMPLETED", 0) > 0:
                    break
                time.sleep(0.2)
            time.sleep(2.0)  # the reader idles in the job now, checkpointing
            sent["at"] = time.monotonic()
            send_interrupt()

        terminator = threading.Thread(target=terminate, daemon=True)
        terminator.start()
        result = built.continuous_job.execute_in_process(
            tags=request.tags, resources={"sluice": sluice}, instance=instance,
            raise_on_error=False,
        )  # fmt: skip
        ended = time.monotonic()
        terminator.join(timeout=5)
    assert "at" in sent, "the run ended before it was interrupted"
    assert not result.success
    assert ended - sent["at"] < CANCEL_SECONDS, f"cancelled after {ended - sent['at']:.0f}s"
    counts = split_counts(settings, source)
    assert not {"ASSIGNED", "READING"} & set(counts), counts  # given back, not left leased
