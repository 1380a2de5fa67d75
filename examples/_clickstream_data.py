"""Sample data of the clickstream example: click/order events as JSON Lines and a ``users``
dimension table.

Deterministic for a given seed. Files are written under a temporary name and renamed, so a
concurrent discovery never sees half a file. A few lines per file are deliberately malformed
(bad JSON, missing or mistyped fields, invalid UTF-8) to exercise the dead-letter path.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import asyncpg
import orjson

from enumerator_service import Settings, qualified_name, quote_identifier
from spark_jobs.pipeline import claim_demo_table

__all__ = ["DemoSpec", "GeneratedData", "generate_events", "load_users"]

EVENT_TYPES = ("page_view", "click", "add_to_cart", "order")
_EVENT_WEIGHTS = (50, 30, 12, 8)
COUNTRIES = ("US", "DE", "FR", "GB", "JP", "BR", "IN", "CN", "CA", "AU", "ES", "IT")
TIERS = ("free", "plus", "pro")
_MARKER = "_demo.json"
#: One line in this many is malformed.
MALFORMED_EVERY = 1000
#: One event in this many references a user id that does not exist (left-join miss).
UNKNOWN_USER_EVERY = 500

Progress = Callable[[int], None]


@dataclass(frozen=True, slots=True)
class DemoSpec:
    events: int
    days: int
    files_per_day: int
    users: int
    start_date: date
    seed: int

    @classmethod
    def from_settings(cls, settings: Settings) -> DemoSpec:
        return cls(
            events=settings.demo_events,
            days=settings.demo_days,
            files_per_day=settings.demo_files_per_day,
            users=settings.demo_users,
            start_date=settings.demo_start_date,
            seed=settings.demo_seed,
        )


@dataclass(frozen=True, slots=True)
class GeneratedData:
    files: int
    events: int
    malformed: int
    skipped: bool


def _user_row(user_id: int, rng: random.Random) -> tuple[int, str, str, str, datetime]:
    signup = datetime(2020, 1, 1, tzinfo=UTC) + timedelta(seconds=rng.randrange(5 * 365 * 86400))
    return (
        user_id,
        f"user_{user_id:07d}",
        COUNTRIES[rng.randrange(len(COUNTRIES))],
        TIERS[min(2, int(rng.random() ** 2 * 3))],
        signup,
    )


def _malformed_line(kind: int, event: dict[str, object]) -> bytes:
    if kind == 0:
        return orjson.dumps(event)[:-7]  # truncated JSON
    if kind == 1:
        return orjson.dumps({k: v for k, v in event.items() if k != "user_id"})
    if kind == 2:
        return orjson.dumps({**event, "amount": "twelve"})
    if kind == 3:
        return b'{"event_id": "\xff\xfe broken", "user_id": 1}'
    return orjson.dumps({**event, "event_time": "yesterday"})


def generate_events(
    landing: Path, spec: DemoSpec, progress: Progress | None = None
) -> GeneratedData:
    """Write ``spec.events`` events over ``spec.days`` days; skip if already generated."""
    marker = landing / _MARKER
    fingerprint = {k: str(v) for k, v in asdict(spec).items()}
    if marker.exists() and json.loads(marker.read_text()).get("spec") == fingerprint:
        stats = json.loads(marker.read_text())
        return GeneratedData(stats["files"], stats["events"], stats["malformed"], skipped=True)

    rng = random.Random(spec.seed)
    n_files = spec.days * spec.files_per_day
    per_file = [
        spec.events // n_files + (1 if i < spec.events % n_files else 0) for i in range(n_files)
    ]
    written = malformed = 0
    for index, count in enumerate(per_file):
        day = spec.start_date + timedelta(days=index // spec.files_per_day)
        part = index % spec.files_per_day
        folder = landing / f"dt={day.isoformat()}"
        folder.mkdir(parents=True, exist_ok=True)
        day_start = datetime(day.year, day.month, day.day, tzinfo=UTC)
        lines: list[bytes] = []
        for i in range(count):
            user_id = rng.randint(1, spec.users)
            if rng.randrange(UNKNOWN_USER_EVERY) == 0:
                user_id = spec.users + rng.randint(1, 1000)
            event_type = rng.choices(EVENT_TYPES, _EVENT_WEIGHTS)[0]
            seconds = (part * 86400 + i * 86400 / max(count, 1)) / spec.files_per_day
            event = {
                "event_id": f"{day:%Y%m%d}-{part:03d}-{i:07d}",
                "user_id": user_id,
                "event_time": (day_start + timedelta(seconds=seconds)).isoformat(),
                "event_type": event_type,
                "amount": round(rng.uniform(5, 500), 2) if event_type == "order" else 0.0,
            }
            if rng.randrange(MALFORMED_EVERY) == 0:
                lines.append(_malformed_line(rng.randrange(5), event))
                malformed += 1
            else:
                lines.append(orjson.dumps(event))
        tmp = folder / f".part-{part:05d}.jsonl.tmp"
        tmp.write_bytes(b"\n".join(lines) + b"\n")
        os.replace(tmp, folder / f"part-{part:05d}.jsonl")
        written += count
        if progress is not None:
            progress(count)
    stats = {"spec": fingerprint, "files": n_files, "events": written, "malformed": malformed}
    marker.write_text(json.dumps(stats))
    return GeneratedData(n_files, written, malformed, skipped=False)


async def _load_users(
    dsn: str, schema: str, table: str, key: str, n: int, seed: int, progress: Progress | None
) -> bool:
    qualified = qualified_name(schema, table)  # quoted: reserved words work as names
    conn = await asyncpg.connect(dsn)
    try:
        # One transaction: only a table sample data created (and marked) is filled,
        # truncated or refilled; a refusal leaves the database as it was.
        async with conn.transaction():
            await claim_demo_table(
                conn,
                schema,
                table,
                f"{quote_identifier(key)} bigint PRIMARY KEY, name text NOT NULL, "
                "country text NOT NULL, tier text NOT NULL, signup_time timestamptz NOT NULL",
            )
            if await conn.fetchval(f"SELECT count(*) FROM {qualified}") == n:
                return False
            rng = random.Random(seed)
            await conn.execute(f"TRUNCATE {qualified}")
            chunk = 100_000
            for low in range(1, n + 1, chunk):
                rows = [_user_row(u, rng) for u in range(low, min(n, low + chunk - 1) + 1)]
                await conn.copy_records_to_table(
                    table,
                    schema_name=schema,
                    records=rows,
                    columns=[key, "name", "country", "tier", "signup_time"],
                )
                if progress is not None:
                    progress(len(rows))
        await conn.execute(f"ANALYZE {qualified}")
        return True
    finally:
        await conn.close()


def load_users(
    dsn: str,
    *,
    schema: str,
    table: str,
    key: str,
    users: int,
    seed: int,
    progress: Progress | None = None,
) -> bool:
    """Create and fill the dimension table; returns False when it already held ``users`` rows.

    Only a table sample data created is written (``claim_demo_table``): an existing table
    without the demo mark raises ``DemoDataRefused`` and is left as it was. ``schema``,
    ``table`` and ``key`` must be validated identifiers.
    """
    return asyncio.run(_load_users(dsn, schema, table, key, users, seed, progress))
