"""``bench/e2e.py``: the generated events, orders and users table (cached)."""

from __future__ import annotations

import time
from pathlib import Path

from _e2e_common import (
    SEED,
    START,
    USERS_TABLE,
    console,
)

from enumerator_service import Settings, asyncpg_dsn
from enumerator_service._operations import Platform
from examples._clickstream_data import DemoSpec, generate_events, load_users

# -- data ------------------------------------------------------------------------------


def _days(files: int) -> int:
    """Day folders for ``files`` files: the largest divisor of ``files`` up to 10."""
    return max(d for d in range(1, min(files, 10) + 1) if files % d == 0)


def prepare_events(settings: Settings, events: int, files: int, users: int) -> Path:
    days = _days(files)
    spec = DemoSpec(
        events=events,
        days=days,
        files_per_day=files // days,
        users=users,
        start_date=START,
        seed=SEED,
    )
    landing = settings.home_path / "bench" / "e2e" / f"events-e{events}-f{files}-u{users}"
    with console.status(f"Events: {events:,} in {files} files under {landing} (cached)…"):
        start = time.perf_counter()
        generated = generate_events(landing, spec)
    console.print(
        f"data: {generated.events:,} events ({generated.malformed} malformed) in "
        f"{generated.files} files, "
        + ("cached" if generated.skipped else f"generated in {time.perf_counter() - start:.0f} s")
    )
    return landing


def prepare_users(platform: Platform, users: int) -> None:
    with console.status(f"Users: {users:,} rows in public.{USERS_TABLE} (cached)…"):
        start = time.perf_counter()
        loaded = load_users(
            asyncpg_dsn(platform.url),
            schema="public",
            table=USERS_TABLE,
            key="id",
            users=users,
            seed=SEED,
        )
    console.print(
        f"users: {users:,} rows in public.{USERS_TABLE}, "
        + (f"loaded in {time.perf_counter() - start:.0f} s" if loaded else "cached")
    )


def prepare_orders(
    settings: Settings, platform: Platform, orders: int, files: int, users: int
) -> Path:
    """The orders example's sample data sized like the events: ``orders`` orders in ``files``
    CSV files, ``users`` customers over 5 tenants (cached like the events)."""
    from examples._orders_data import write_orders
    from spark_jobs import SampleTarget

    days = _days(files)
    sized = settings.model_copy(
        update={
            "demo_events": orders,
            "demo_days": days,
            "demo_files_per_day": files // days,
            "demo_users": users,
            "demo_start_date": START,
            "demo_seed": SEED,
        }
    )
    landing = settings.home_path / "bench" / "e2e" / f"orders-e{orders}-f{files}-u{users}"
    with console.status(f"Orders: {orders:,} in {files} CSV files under {landing} (cached)…"):
        start = time.perf_counter()
        said = write_orders(SampleTarget(sized, landing, asyncpg_dsn(platform.url)))
    console.print(f"orders: {said} ({time.perf_counter() - start:.0f} s)")
    return landing


def landing_files(landing: Path) -> list[Path]:
    return sorted(landing.glob("dt=*/*.jsonl"))


def count_lines(files: list[Path]) -> int:
    total = 0
    for path in files:
        with path.open("rb") as f:
            total += sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    return total
