"""The scoring example end to end: an AsyncMap calling a real HTTP service on 127.0.0.1,
with bounded requests in flight and slow requests answered by the function's ``timeout()``
fallback — against an oracle computed from the landing files and the service's rule."""

from __future__ import annotations

import dataclasses
from typing import Any

import pyarrow.dataset as ds
import pytest
from conftest import TestSettings
from demo_platform import prepare_demo
from landing_oracle import expected_events

from enumerator_service._operations import discover, open_platform
from examples.scoring import scoring_pipeline
from examples.scoring_service import ScoringService, is_slow, score_of
from spark_jobs.connectors.parquet import output_path
from spark_jobs.jobs import run_pipeline
from spark_jobs.pipeline._paths import discovery_of

pytestmark = pytest.mark.spark

SLOW_SHARE = 0.05


def test_orders_are_scored_and_slow_answers_fall_back(make_settings: Any) -> None:
    settings: TestSettings = make_settings(demo_events=2000, parallelism=2)
    platform = open_platform(settings)
    try:
        prepare_demo(settings, platform)
        # Fast answers must stay fast under a loaded machine: 4 s of headroom below the
        # timeout (a 2 s timeout failed once at load 7 on 2 cores), slow ones well above it.
        with ScoringService(slow_share=SLOW_SHARE, slow_seconds=9.0) as service:
            pipeline = scoring_pipeline(
                service.url,
                name=settings.source_name,
                landing=str(settings.landing_path),
                timeout="4s",
            )
            capacity = pipeline.plan.stages[1].capacity  # type: ignore[attr-defined]
            discover(platform, discovery_of(pipeline, settings))
            summary = run_pipeline(settings, pipeline)
            requests, peak = service.requests, service.peak
        events, malformed = expected_events(settings.landing_path)
        orders = {e["event_id"]: e for e in events if e["event_type"] == "order"}
        rows = ds.dataset(output_path(pipeline, settings), format="parquet").to_table()
        found = {r["event_id"]: r for r in rows.to_pylist()}
        assert sorted(found) == sorted(orders)  # every order once, nothing else
        slow = [i for i in orders if is_slow(i, SLOW_SHARE)]
        assert 0 < len(slow) < len(orders)
        for event_id, row in found.items():
            if event_id in slow:  # answered by ScoringClient.timeout()
                assert (row["score"], row["scored"]) == (None, False)
            else:
                assert (row["score"], row["scored"]) == (score_of(orders[event_id]["amount"]), True)
        assert (summary.rows_out, summary.dead_letters) == (len(orders), malformed)
        assert summary.dropped == len(events) - len(orders)  # the filter
        assert requests == len(orders)  # one request per record, no retries
        assert 1 < peak <= capacity * settings.parallelism  # bounded in flight
    finally:
        platform.close()


def test_a_landing_folder_by_name_is_under_the_data_folder(make_settings: Any) -> None:
    settings: TestSettings = make_settings()
    pipeline = dataclasses.replace(scoring_pipeline("http://127.0.0.1:1/score"))
    assert pipeline.plan.source.options.landing is not None
    assert str(pipeline.plan.source.options.landing) == "landing/events"
    assert discovery_of(pipeline, settings).landing == settings.data_path / "landing" / "events"
