"""A run id names one run. Used again — by another pipeline, or by the same one (a Dagster
re-execution copies the run's tags, ``sluice/run_id`` among them) — the run is refused with
one line before anything moves, and a run with a new id then reads everything. (Before the
refusal such a run ended at once: an earlier run's state under the id was taken for its own,
its rows were reported out and never committed.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest
from conftest import TestSettings as Settings
from demo_platform import demo_discover, demo_pipeline, prepare_demo
from landing_oracle import expected_events

from enumerator_service import ConfigError
from enumerator_service._operations import discover, open_platform
from spark_jobs.jobs import run_pipeline
from spark_jobs.pipeline import discovery_of

pytestmark = pytest.mark.spark


def _event_ids(folder: Path) -> list[str]:
    table = ds.dataset(folder, format="parquet").to_table(columns=["event_id"])
    return sorted(table.column(0).to_pylist())


def test_a_run_id_used_before_is_refused_and_nothing_is_lost(make_settings: Any) -> None:
    first: Settings = make_settings(demo_events=300, demo_days=1, demo_files_per_day=2)
    second = first.model_copy(update={"source_name": f"{first.source_name}_b"})
    platform = open_platform(first)
    run_id = f"reused-{first.source_name}"
    try:
        prepare_demo(first, platform)
        prepare_demo(second, platform)
        demo_discover(platform)
        run_pipeline(first, demo_pipeline(first), run_id=run_id)
        events, _bad = expected_events(first.landing_path)
        assert _event_ids(first.output_path) == sorted(e["event_id"] for e in events)
        other = demo_pipeline(second)
        discover(platform, discovery_of(other, second))
        for settings, pipeline in ((second, other), (first, demo_pipeline(first))):
            with pytest.raises(ConfigError, match="names an earlier run") as refused:
                run_pipeline(settings, pipeline, run_id=run_id)
            assert "\n" not in str(refused.value)
        assert not second.output_path.exists()  # nothing moved
        run_pipeline(second, other, run_id=f"{run_id}-new")
        events, _bad = expected_events(second.landing_path)
        assert _event_ids(second.output_path) == sorted(e["event_id"] for e in events)
    finally:
        platform.close()
