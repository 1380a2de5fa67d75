"""The demo pipeline of a test: the clickstream example under the test's own name (its split
source) and folders, with its sample data loaded on the test's platform."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import date
from typing import Any

from conftest import TestSettings

from enumerator_service import DiscoveryResult, asyncpg_dsn
from enumerator_service._operations import Platform, discover
from examples._clickstream_data import DemoSpec, generate_events, load_users
from examples.clickstream import clickstream
from spark_jobs import ParquetSink, Pipeline, PostgresSink
from spark_jobs.jobs import RunSummary, run_pipeline
from spark_jobs.pipeline._paths import discovery_of

DICTIONARY = ("event_type", "user_country", "user_tier")


def demo_pipeline(
    settings: TestSettings, *, table: str | None = None, upsert: bool = False, **changes: Any
) -> Pipeline:
    """The clickstream pipeline named ``settings.source_name``, reading
    ``settings.landing_path`` and writing ``settings.output_path`` (Parquet), or the Postgres
    table ``table`` (appending, or upserting by event id)."""
    source = dataclasses.replace(clickstream.source, landing=settings.landing_path)
    sink = (
        ParquetSink(f"enriched_{settings.source_name}", dictionary=DICTIONARY)
        if table is None
        else PostgresSink(table, upsert_key=["event_id"] if upsert else None)
    )
    return dataclasses.replace(
        clickstream, name=settings.source_name, source=source, sink=sink, **changes
    )


def prepare_demo(settings: TestSettings, platform: Platform, *, events: bool = True) -> None:
    """Generate the demo landing files (unless ``events`` is False) and load ``public.users``."""
    if events:
        generate_events(settings.landing_path, DemoSpec.from_settings(settings))
    load_users(
        asyncpg_dsn(platform.url),
        schema="public",
        table="users",
        key="id",
        users=settings.demo_users,
        seed=settings.demo_seed,
    )


def demo_discover(
    platform: Platform, dates: Sequence[date] | None = None, **changes: object
) -> DiscoveryResult:
    """One discovery tick of the test's demo pipeline."""
    settings = platform.settings
    assert isinstance(settings, TestSettings)
    pipeline = demo_pipeline(settings, **changes)  # type: ignore[arg-type]
    return discover(platform, discovery_of(pipeline, settings), dates=dates)


def demo_run(
    settings: TestSettings, *, table: str | None = None, upsert: bool = False, **options: Any
) -> RunSummary:
    """One run of the test's demo pipeline (``run_pipeline`` options)."""
    return run_pipeline(settings, demo_pipeline(settings, table=table, upsert=upsert), **options)
