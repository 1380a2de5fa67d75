"""The clickstream pipeline: web events enriched with the users they belong to.

JSON Lines events (``data/landing/events/dt=YYYY-MM-DD/*.jsonl``) are looked up in
``public.users`` by ``user_id`` (a left join: events of unknown users are kept) and written
as Parquet, by day, to ``data/warehouse/enriched_events``. ``make demo`` runs it on sample
data (``sluice demo clickstream``). ``examples.clickstream_iceberg`` is the same pipeline
writing an Iceberg table, with the revenue-by-country asset downstream of it.
"""

from __future__ import annotations

from collections.abc import Callable

from examples._clickstream_data import DemoSpec, generate_events, load_users
from spark_jobs import FileSource, Lookup, ParquetSink, Pipeline, SampleTarget

__all__ = ["clickstream", "write_sample_data"]


def write_sample_data(target: SampleTarget) -> str:
    """Sample events (``SLUICE_DEMO_EVENTS`` over ``SLUICE_DEMO_DAYS``) and ``public.users``
    (``SLUICE_DEMO_USERS`` rows); both skipped when already there. ``public.users`` is only
    written when sample data created it (``claim_demo_table``)."""
    spec = DemoSpec.from_settings(target.settings)
    progress = target.progress
    # The table first: a public.users that sample data did not create refuses the whole
    # command before any file is written.
    load_users(
        target.dsn,
        schema="public",
        table="users",
        key="id",
        users=spec.users,
        seed=spec.seed,
        progress=None if progress is None else _counter(progress, "users", spec.users),
    )
    events = generate_events(
        target.landing,
        spec,
        None if progress is None else _counter(progress, "events", spec.events),
    )
    return (
        f"{events.files} files, {events.events:,} events ({events.malformed} malformed) in "
        f"{target.landing}; {spec.users:,} users in public.users"
    )


def _counter(
    progress: Callable[[str, int, int], None], what: str, total: int
) -> Callable[[int], None]:
    """A callback counting increments into ``progress(what, done, total)``."""
    done = [0]

    def advance(n: int) -> None:
        done[0] += n
        progress(what, done[0], total)

    return advance


clickstream = Pipeline(
    name="clickstream",
    description="Web events enriched with their users, Parquet by day.",
    source=FileSource(
        landing="landing/events",
        schema={
            "event_id": "string",
            "user_id": "int64",
            "event_time": "timestamp",
            "event_type": "string",
            "amount": "float64",
        },
        required=["event_id", "user_id", "event_time", "event_type", "amount"],
        event_time="event_time",
        partition_by="day",
    ),
    steps=[
        Lookup(
            "public.users",
            on={"user_id": "id"},
            columns={
                "name": "user_name",
                "country": "user_country",
                "tier": "user_tier",
                "signup_time": "user_signup_time",
            },
            on_miss="keep",
        ),
    ],
    # Dictionary encoding only where values repeat (on unique ids it costs and saves nothing).
    sink=ParquetSink("enriched_events", dictionary=["event_type", "user_country", "user_tier"]),
    key=["event_id"],
    sample_data=write_sample_data,
)
