"""The ``no_quarantined_splits`` asset check: a partition with a quarantined (FAILED) split
fails it, with the files and reasons in its metadata; the other partition passes; after
``retry`` it passes again. Real Dagster (checks launched on their own, as from the UI), real
Postgres; no Spark run (the split is quarantined through the commit path directly).

No ``__init__.py`` in this folder on purpose (see test_definitions.py).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import date
from typing import Any

from conftest import TestSettings
from dagster import AssetSelection, DagsterInstance, materialize
from dagster_support import demo_definitions
from sluice_resource import resource_for

from enumerator_service import FileSplit, SplitStore
from enumerator_service._checkpoint_commit import apply_split_states
from enumerator_service._operations import open_platform
from enumerator_service._quarantine import retry_splits

MakeSettings = Callable[..., TestSettings]
BAD, GOOD = date(2026, 1, 1), date(2026, 1, 2)


def _check(settings: TestSettings, day: date) -> Any:
    built = demo_definitions(settings)
    with DagsterInstance.ephemeral() as instance:
        result = materialize(
            [built.output, *built.checks],
            selection=AssetSelection.checks_for_assets(built.output),
            tags={"dagster/partition": day.isoformat()},
            resources={"sluice": resource_for(settings)},
            instance=instance,
        )
    assert result.success
    (found,) = [
        e for e in result.get_asset_check_evaluations() if e.check_name == "no_quarantined_splits"
    ]
    return found


def test_a_quarantined_split_fails_its_partitions_check(make_settings: MakeSettings) -> None:
    settings = make_settings(split_max_attempts=1)
    platform = open_platform(settings)
    try:
        store, source = SplitStore(platform.engine), settings.source_name
        path = str(settings.landing_path / f"dt={BAD}" / "bad.jsonl.gz")
        store.register([FileSplit(source, "jsonl.gz", path, 0, None, BAD)])
        store.assign_to_run("run-1", source, lease_seconds=60)
        split = store.pull_next("run-1", 0, 60)
        assert split is not None
        failed = {"reason": "truncated compressed stream", "error": "EOFError: ended early"}
        state = {
            "id": split.split_id,
            "epoch": split.epoch,
            "offset": 0,
            "watermark": None,
            "finished": True,
            "pending": [],
            "failed": {**failed, "max_attempts": 1},
        }
        with platform.engine.begin() as conn:
            apply_split_states(conn, "run-1", [state], skip_fenced=False)
        bad = _check(settings, BAD)
        assert not bad.passed and bad.partition == BAD.isoformat()
        assert (bad.description or "").startswith(f"{BAD}: 1 quarantined splits")
        assert "truncated compressed stream" in (bad.description or "")
        metadata = {k: v.value for k, v in bad.metadata.items()}
        assert metadata["quarantined_splits"] == 1
        assert f"split {split.split_id}: {path} — truncated compressed stream" in metadata["files"]
        assert "EOFError: ended early" in metadata["files"]
        assert _check(settings, GOOD).passed
        assert retry_splits(platform.engine, [split.split_id])
        assert _check(settings, BAD).passed
    finally:
        platform.close()
