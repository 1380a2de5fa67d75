"""The platform operations shared by the CLI and Dagster: open, migrate, discover, inspect."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from enumerator_service._config import ConfigError, Settings
from enumerator_service._database import connect_engine, database_url, upgrade_schema
from enumerator_service._enumerator import (
    ContinuousFileEnumerator,
    DiscoveryResult,
    SplitEnumerator,
    StaticFileEnumerator,
)
from enumerator_service._schema import checkpoints, dead_letters, sink_transactions
from enumerator_service._split_store import SplitStore

__all__ = ["Platform", "PlatformStatus", "discover", "open_platform", "platform_status"]


@dataclass(frozen=True)
class Platform:
    """A connected platform database: its URL (secret) and a control-path Engine."""

    settings: Settings
    url: str
    engine: Engine

    def close(self) -> None:
        self.engine.dispose()


def open_platform(settings: Settings, *, migrate: bool = True) -> Platform:
    """Connect (starting the embedded Postgres if needed) and bring the schema up to date."""
    url = database_url(settings)
    engine = connect_engine(url)
    if migrate:
        upgrade_schema(engine)
    return Platform(settings, url, engine)


def discover(platform: Platform, *, dates: Sequence[date] | None = None) -> DiscoveryResult:
    """One enumerator tick over the landing folder (bounded to ``dates`` when given).

    Without ``dates`` the tick registers at most ``discovery_max_files_per_tick`` files; the
    result's ``backlog_files`` says how many the next tick will continue with.
    """
    settings = platform.settings
    landing = settings.landing_path
    if not landing.is_dir():
        raise ConfigError("SLUICE_LANDING_DIR", f"folder does not exist: {landing}")
    enumerator: SplitEnumerator
    if dates is not None:
        enumerator = StaticFileEnumerator(
            platform.engine,
            settings.source_name,
            landing,
            dates=dates,
            lease_seconds=settings.lease_seconds,
            target_split_bytes=settings.target_split_bytes,
        )
    else:
        # A tick of the sensor must stay short whatever the backlog: capped (a backfill's
        # bounded listing of some dates runs inside its run, not in a tick, and is not).
        enumerator = ContinuousFileEnumerator(
            platform.engine,
            settings.source_name,
            landing,
            lease_seconds=settings.lease_seconds,
            target_split_bytes=settings.target_split_bytes,
            max_files_per_tick=settings.discovery_max_files_per_tick,
        )
    return enumerator.discover()


@dataclass(frozen=True)
class PlatformStatus:
    splits: dict[str, int]
    rows_committed: int
    dead_letters: int
    dead_letter_reasons: list[tuple[str, int]]
    last_checkpoint: dict[str, Any] | None
    last_commit_at: datetime | None


def platform_status(platform: Platform) -> PlatformStatus:
    source = platform.settings.source_name
    reason = sa.func.split_part(dead_letters.c.reason, ":", 1)
    with platform.engine.connect() as conn:
        rows, last_commit = conn.execute(
            sa.select(
                sa.func.coalesce(sa.func.sum(sink_transactions.c.row_count), 0),
                sa.func.max(sink_transactions.c.committed_at),
            ).where(sink_transactions.c.committed)
        ).one()
        reasons = conn.execute(
            sa.select(reason, sa.func.count())
            .where(dead_letters.c.source == source)
            .group_by(reason)
            .order_by(sa.func.count().desc())
        ).all()
        last = conn.execute(
            sa.select(checkpoints)
            .order_by(checkpoints.c.triggered_at.desc(), checkpoints.c.checkpoint_id.desc())
            .limit(1)
        ).first()
    return PlatformStatus(
        splits=SplitStore(platform.engine).counts(source),
        rows_committed=int(rows),
        dead_letters=sum(n for _, n in reasons),
        dead_letter_reasons=[(r, n) for r, n in reasons],
        last_checkpoint=dict(last._mapping) if last is not None else None,
        last_commit_at=last_commit,
    )
