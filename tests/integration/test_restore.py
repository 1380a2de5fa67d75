"""Restoring a split from a committed checkpoint: in-flight inputs are re-invoked, reading
resumes at the committed offset, and each record is emitted exactly once."""

from __future__ import annotations

from typing import Any

import orjson
import pyarrow.dataset as ds
import pytest
import sqlalchemy as sa
from enumerator_service._demo_data import load_users

from enumerator_service import Settings, asyncpg_dsn
from enumerator_service._operations import Platform, discover, open_platform
from enumerator_service._schema import splits
from spark_jobs.jobs import run_enrichment
from spark_jobs.jobs._task_state import decode_event, encode_event
from spark_jobs.source import parse_event
from spark_jobs.source._records import RawLine

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


def test_a_restored_split_reinvokes_its_in_flight_inputs_then_reads_on(make_settings: Any) -> None:
    settings: Settings = make_settings()
    platform = open_platform(settings)
    try:
        lines = land_ten_events(settings, platform)
        assert discover(platform).splits_registered == 1
        # The committed checkpoint: lines 0-3 were emitted (their output is committed
        # elsewhere), lines 4-6 were in flight in the async operator, lines 7-9 not read.
        offset = sum(len(line) for line in lines[:7])
        starts = [sum(len(line) for line in lines[:i]) for i in range(11)]
        in_flight = []
        for i in (4, 5, 6):
            event = parse_event(0, RawLine(starts[i], starts[i + 1], lines[i]), 1 << 20)
            assert event is not None and not isinstance(event, str)
            in_flight.append(encode_event(event))
        assert decode_event(0, in_flight[0]).event_id == "r4"
        with platform.engine.begin() as conn:
            conn.execute(
                sa.update(splits)
                .where(splits.c.source == settings.source_name)
                .values(committed_offset=offset, pending=in_flight)
            )
        summary = run_enrichment(settings)
        assert (summary.splits, summary.rows_out) == (1, 6)
        rows = ds.dataset(settings.output_path, format="parquet").to_table().to_pylist()
        assert sorted(r["event_id"] for r in rows) == [f"r{i}" for i in range(4, 10)]
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
        assert discover(platform).splits_registered == 1
        starts = [sum(len(line) for line in lines[:i]) for i in range(11)]
        # Committed: lines 0-3 emitted, the block of lines 4-6 pending, 7-9 not read.
        with platform.engine.begin() as conn:
            conn.execute(
                sa.update(splits)
                .where(splits.c.source == settings.source_name)
                .values(committed_offset=starts[7], pending=[{"span": [starts[4], starts[7]]}])
            )
        summary = run_enrichment(settings)
        assert (summary.splits, summary.rows_out, summary.dead_letters) == (1, 5, 0)
        rows = ds.dataset(settings.output_path, format="parquet").to_table().to_pylist()
        assert sorted(r["event_id"] for r in rows) == ["r4", "r6", "r7", "r8", "r9"]
        assert all(r["user_name"] is not None for r in rows)
    finally:
        platform.close()
