"""A subtask attempt retried after its final checkpoint completed (its worker died between
that completion and the end of the Spark task) has nothing left to do: it ends at once
instead of waiting for a checkpoint the coordinator — for which the subtask is a closed
channel — would never trigger. (Found by the fault test: the run hung.)"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from conftest import TestSettings
from demo_platform import demo_discover, demo_pipeline, prepare_demo

from enumerator_service import database_url
from enumerator_service._operations import open_platform
from spark_jobs.jobs import ReaderRun, SubtaskResult, run_pipeline, run_reader_subtask
from spark_jobs.pipeline._catalog import resolve

pytestmark = pytest.mark.spark


def test_a_retried_attempt_of_a_finished_subtask_ends_at_once(make_settings: Any) -> None:
    settings: TestSettings = make_settings(demo_events=400)
    platform = open_platform(settings)
    try:
        prepare_demo(settings, platform)
        demo_discover(platform)
        pipeline = demo_pipeline(settings)
        summary = run_pipeline(settings, pipeline)
        assert summary.rows_out > 0
        # The same run's subtask 0 again, as Spark would retry it: no coordinator runs now.
        run = ReaderRun(settings, pipeline, run_id=summary.run_id)
        run._url = database_url(settings)
        config = run._task_config(resolve(pipeline, platform.engine))
        results: list[SubtaskResult] = []
        attempt = threading.Thread(
            target=lambda: results.append(run_reader_subtask(config, 0)), daemon=True
        )
        attempt.start()
        attempt.join(timeout=30)
        assert not attempt.is_alive(), "the retried attempt waits for a checkpoint forever"
        (result,) = results
        assert (result.subtask, result.rows_written, result.checkpoints_acked) == (0, 0, 0)
    finally:
        platform.close()
