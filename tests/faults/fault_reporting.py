"""After the fault runs: report the pipeline's completed partitions to Dagster once.

The pipeline's ``<pipeline>_report_completions`` sensor runs in the test process against an
ephemeral Dagster instance (the runs' own database), twice: the first tick reports every
completion the runs' checkpoints committed, the second must report nothing. The answer counts
the materialisations per (day, generation) — exactly once each is the assertion — and what is
left unreported or open.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from datetime import date
from unittest import mock

import sqlalchemy as sa
from dagster import AssetRecordsFilter, DagsterInstance, build_sensor_context
from sluice_resource import resource_for

from dagster_project import pipeline_definitions
from dagster_project.completions import GENERATION_TAG, PARTITION_TAG
from enumerator_service import Settings, connect_engine
from enumerator_service._schema import partition_completions, partition_stats
from spark_jobs.pipeline._registry import load_pipelines

__all__ = ["Reporting", "report_completions_once"]


@dataclass(frozen=True, slots=True)
class Reporting:
    #: Completions the runs committed, per (day, generation).
    completed: set[tuple[date, int]]
    #: Materialisations in Dagster after the ticks, per (day, generation).
    materialized: Counter[tuple[date, int]]
    #: Completions still unmarked after the ticks.
    unreported: int
    #: Days with committed output that no completion covers (``partition_stats.open``).
    open_days: list[date]
    #: Completions the second tick reported (must be none).
    reported_again: int

    def line(self) -> str:
        twice = sum(1 for n in self.materialized.values() if n > 1)
        return (
            f"reporting: {len(self.completed)} completions, {len(self.materialized)} reported "
            f"({twice} more than once), {self.unreported} unreported, "
            f"open days {[d.isoformat() for d in self.open_days]}"
        )


def report_completions_once(env: dict[str, str], source: str) -> Reporting:
    """Run ``source``'s reporter sensor with the runs' settings (``env``: their SLUICE_*)."""
    settings_env = {k: v for k, v in env.items() if k.startswith("SLUICE_")}
    with mock.patch.dict(os.environ):
        for name in [name for name in os.environ if name.startswith("SLUICE_")]:
            del os.environ[name]
        os.environ.update(settings_env)
        settings = Settings()
        built = pipeline_definitions(load_pipelines(settings)[source], settings)
        (sensor,) = [s for s in built.sensors if s.name == f"{source}_report_completions"]
        key = built.output.key
        with DagsterInstance.ephemeral() as instance:
            ticks = []
            for _ in range(2):
                with build_sensor_context(
                    instance=instance, resources={"sluice": resource_for(settings)}
                ) as context:
                    ticks.append(sensor(context))
            records = instance.fetch_materializations(
                AssetRecordsFilter(asset_key=key), limit=10_000
            ).records
    materialized: Counter[tuple[date, int]] = Counter()
    for record in records:
        tags = (record.asset_materialization.tags or {}) if record.asset_materialization else {}
        materialized[date.fromisoformat(tags[PARTITION_TAG]), int(tags[GENERATION_TAG])] += 1
    reported_again = len(getattr(ticks[1], "run_requests", None) or [])
    assert settings.database_url is not None
    engine = connect_engine(settings.database_url.get_secret_value())
    try:
        with engine.connect() as conn:
            c, s = partition_completions, partition_stats
            rows = conn.execute(
                sa.select(c.c.partition_key, c.c.generation, c.c.reported_at).where(
                    c.c.source == source
                )
            ).all()
            open_days = conn.execute(
                sa.select(s.c.partition_key)
                .where(s.c.source == source, s.c.open)
                .order_by(s.c.partition_key)
            ).scalars()
            return Reporting(
                completed={(r.partition_key, r.generation) for r in rows},
                materialized=materialized,
                unreported=sum(1 for r in rows if r.reported_at is None),
                open_days=list(open_days),
                reported_again=reported_again,
            )
    finally:
        engine.dispose()
