"""The demo data of a test's settings: landing files and the users table, on its platform."""

from __future__ import annotations

from enumerator_service import Settings, asyncpg_dsn
from enumerator_service._demo_data import DemoSpec, generate_events, load_users
from enumerator_service._operations import Platform


def prepare_demo(settings: Settings, platform: Platform, *, events: bool = True) -> None:
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
