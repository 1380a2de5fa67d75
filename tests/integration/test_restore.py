"""Restoring a split from a committed checkpoint: the ranges in flight are read again and
re-run through the chain, reading resumes at the committed offset, and each record is
emitted exactly once."""

from __future__ import annotations

from typing import Any

import orjson
import pyarrow.dataset as ds
import pytest
import sqlalchemy as sa
from conftest import TestSettings as Settings
from demo_platform import demo_discover, demo_run

from enumerator_service import asyncpg_dsn
from enumerator_service._operations import Platform, open_platform
from enumerator_service._schema import splits
from examples._clickstream_data import load_users

pytestmark = pytest.mark.spark


def land_ten_events(
    settings: Settings, platform: Platform, bad_line: int | None = None
) -> list[bytes]:
    """Users 1-50, and one landing file of ten click events (``bad_line`` malformed); its lines."""
    load_users(
        asyncpg_dsn(platform.url), schema="public", table="users", key="id", users=50, seed=1
    )
    folder = settings.landing_path / "dt=2026-01-03"
    folder.mkdir(parents=True)
    lines = [
        orjson.dumps(
            {
                "event_id": f"r{i}",
                "user_id": i + 1,
                "event_time": f"2026-01-03T00:00:0{i}+00:00",
                "event_type": "click",
                "amount": float(i),
            }
        )
        + b"\n"
        for i in range(10)
    ]
    if bad_line is not None:
        lines[bad_line] = b"{not json\n"
    (folder / "a.jsonl").write_bytes(b"".join(lines))
    return lines


def test_records_of_a_per_record_step_are_re_read_alone(make_settings: Any) -> None:
    """A range with ``only`` (records a per-record step held) re-reads exactly those records:
    the others of the range were emitted before the checkpoint."""
    settings: Settings = make_settings()
    platform = open_platform(settings)
    try:
        lines = land_ten_events(settings, platform)
        assert demo_discover(platform).splits_registered == 1
        starts = [sum(len(line) for line in lines[:i]) for i in range(11)]
        # Committed: lines 0-8 read; of 4-8, records 4, 6 and 8 were still in flight.
        pending = [{"span": [starts[4], starts[9]], "only": [starts[4], starts[6], starts[8]]}]
        with platform.engine.begin() as conn:
            conn.execute(
                sa.update(splits)
                .where(splits.c.source == settings.source_name)
                .values(committed_offset=starts[9], pending=pending)
            )
        summary = demo_run(settings)
        assert (summary.splits, summary.rows_out) == (1, 4)
        rows = ds.dataset(settings.output_path, format="parquet").to_table().to_pylist()
        assert sorted(r["event_id"] for r in rows) == ["r4", "r6", "r8", "r9"]
        assert all(r["user_name"] is not None for r in rows)
        with platform.engine.connect() as conn:
            state = conn.execute(
                sa.select(splits.c.status, splits.c.committed_offset, splits.c.pending).where(
                    splits.c.source == settings.source_name
                )
            ).one()
        assert tuple(state) == ("COMPLETED", sum(len(line) for line in lines), None)
    finally:
        platform.close()


def test_a_restored_block_is_re_read_from_its_byte_range(make_settings: Any) -> None:
    """Blocks of JSON Lines are checkpointed as ``{"span": [start, end]}``: restore re-reads
    and re-parses the range, invokes its events again, and does not dead-letter its malformed
    lines a second time (they were committed when the block was emitted)."""
    settings: Settings = make_settings()
    platform = open_platform(settings)
    try:
        lines = land_ten_events(settings, platform, bad_line=5)
        assert demo_discover(platform).splits_registered == 1
        starts = [sum(len(line) for line in lines[:i]) for i in range(11)]
        # Committed: lines 0-3 emitted, the block of lines 4-6 pending, 7-9 not read.
        with platform.engine.begin() as conn:
            conn.execute(
                sa.update(splits)
                .where(splits.c.source == settings.source_name)
                .values(committed_offset=starts[7], pending=[{"span": [starts[4], starts[7]]}])
            )
        summary = demo_run(settings)
        assert (summary.splits, summary.rows_out, summary.dead_letters) == (1, 5, 0)
        rows = ds.dataset(settings.output_path, format="parquet").to_table().to_pylist()
        assert sorted(r["event_id"] for r in rows) == ["r4", "r6", "r7", "r8", "r9"]
        assert all(r["user_name"] is not None for r in rows)
    finally:
        platform.close()
