"""A run's subtasks are gang-scheduled (one Spark barrier stage): a run that needs more task
slots than Spark has fails at once with one line naming SLUICE_PARALLELISM — before, the
subtasks that got a slot waited forever for checkpoints the others never acknowledged — and a
killed Python worker restarts the whole stage, which restores every subtask from the last
completed checkpoint: the output holds each event exactly once."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from typing import Any

import pyarrow.dataset as ds
import pytest
import sqlalchemy as sa
from conftest import TestSettings
from demo_platform import demo_discover, demo_pipeline, prepare_demo
from landing_oracle import expected_events
from spark_workers import python_workers

from enumerator_service import ConfigError
from enumerator_service._operations import open_platform
from spark_jobs._spark import spark_for
from spark_jobs.jobs import RunSummary, run_pipeline

pytestmark = pytest.mark.spark

#: No run in this file may take longer (the hang this guards against is forever).
RUN_LIMIT = 90.0


def _in_thread(target: Any) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def body() -> None:
        try:
            out.append(target())
        except BaseException as exc:  # handed to the test
            out.append(exc)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, out


def _finish(thread: threading.Thread, settings: TestSettings) -> None:
    thread.join(RUN_LIMIT)
    if thread.is_alive():
        spark_for(settings).sparkContext.cancelAllJobs()  # do not leave it to later tests
        thread.join(30)
        pytest.fail(f"the run was still going after {RUN_LIMIT:.0f} s: it hangs")


def test_more_subtasks_than_task_slots_fail_fast_with_one_line(make_settings: Any) -> None:
    settings: TestSettings = make_settings(demo_events=4_000, parallelism=4)  # on local[2]
    platform = open_platform(settings)
    try:
        prepare_demo(settings, platform)
        registered = demo_discover(platform).splits_registered
        assert registered >= 4  # enough splits for 4 subtasks
        started = time.monotonic()
        thread, out = _in_thread(lambda: run_pipeline(settings, demo_pipeline(settings)))
        _finish(thread, settings)
        seconds = time.monotonic() - started
        (error,) = out
        assert isinstance(error, ConfigError), error
        assert error.setting == "SLUICE_PARALLELISM"
        message = str(error)
        assert "\n" not in message
        assert "4 subtasks must run at once" in message and "has 2 task slots" in message
        assert seconds < 30, f"took {seconds:.1f} s to fail"
        # Nothing was taken: every split is back in the pool, and a run that fits does it all.
        with platform.engine.connect() as conn:
            held = conn.execute(
                sa.text(
                    "SELECT count(*) FROM sluice.splits WHERE source = :s AND run_id IS NOT NULL"
                ),
                {"s": settings.source_name},
            ).scalar_one()
        assert held == 0
        fits = settings.model_copy(update={"parallelism": 2})
        summary = run_pipeline(fits, demo_pipeline(settings))
        assert summary.splits == registered
    finally:
        platform.close()


def _completed(engine: sa.Engine, source: str) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.text(
                    "SELECT count(*) FROM sluice.splits WHERE source = :s AND status = 'COMPLETED'"
                ),
                {"s": source},
            ).scalar_one()
        )


def _output_event_ids(settings: TestSettings) -> Counter[str]:
    dataset = ds.dataset(settings.output_path, format="parquet", partitioning="hive")
    return Counter(dataset.to_table(columns=["event_id"]).column("event_id").to_pylist())


def test_a_killed_worker_restarts_the_whole_stage_exactly_once(make_settings: Any) -> None:
    settings: TestSettings = make_settings(
        demo_events=15_000,
        demo_users=5_000,
        target_split_bytes=64 << 10,
        # ~600 blocks looked up one at a time, 20 ms each: the run takes seconds however fast
        # the machine, so the kill lands while some splits are committed and others are not.
        read_block_bytes=4096,
        lookup_capacity=1,
        lookup_injected_latency_ms=20,
        checkpoint_interval_seconds=0.5,
        checkpoint_timeout_seconds=10,
        lease_seconds=5,
    )
    platform = open_platform(settings)
    spark = spark_for(settings)
    thread = threading.Thread()
    try:
        prepare_demo(settings, platform)
        total = demo_discover(platform).splits_registered

        def run() -> RunSummary:
            # Job groups are per thread: this one lets the test find the run's Spark job.
            spark.sparkContext.setJobGroup("gang-kill", "killed worker test")
            return run_pipeline(settings, demo_pipeline(settings))

        thread, out = _in_thread(run)
        killed, committed = None, 0
        deadline = time.monotonic() + RUN_LIMIT
        # Kill one Python worker once some splits are committed and some are not.
        while killed is None and thread.is_alive() and time.monotonic() < deadline:
            committed = _completed(platform.engine, settings.source_name)
            workers = python_workers()
            if len(workers) >= 2 and 0 < committed < total:
                killed = workers[0].pid
                os.kill(killed, signal.SIGKILL)
            time.sleep(0.05)
        _finish(thread, settings)
        assert killed is not None, f"the run ended before a kill ({committed} of {total})"
        (summary,) = out
        assert isinstance(summary, RunSummary), summary
        tracker = spark.sparkContext.statusTracker()
        (job,) = tracker.getJobIdsForGroup("gang-kill")
        attempts = [
            tracker.getStageInfo(s).currentAttemptId for s in tracker.getJobInfo(job).stageIds
        ]
        assert max(attempts) >= 1, "the barrier stage was not restarted"
        good, _bad = expected_events(settings.landing_path)
        seen = _output_event_ids(settings)
        assert sum(n - 1 for n in seen.values()) == 0, "duplicates"
        assert set(seen) == {e["event_id"] for e in good}, "missing or unexpected events"
        assert summary.splits == total
    finally:
        if thread.is_alive():  # a failed assertion above: do not leave the run to later tests
            spark.sparkContext.cancelAllJobs()
            thread.join(30)
        platform.close()
