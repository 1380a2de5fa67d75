"""The test-only generator connector's split reader through the platform's FormatRouter (no
Postgres, no Spark): the router finds it by split kind in the registry, a read resumes
exactly at its offset, a replayed range holds exactly its records, and a paced ``fetch``
returns early on ``wake_up`` with its position kept."""

from __future__ import annotations

import threading
import time
from datetime import date

import pyarrow as pa

from enumerator_service import FileSplit, SplitAssignment
from spark_jobs.connectors import source_connector_for_split
from spark_jobs.source import OFFSET, FormatRouter, RecordSchema, SplitRead
from tests.connectors.generator import GeneratorConnector, GeneratorSplitReader
from tests.connectors.generator_pipeline import generated, generated_paced
from tests.connectors.oracle import oracle

DAY = date(2026, 5, 1)


def _schema() -> RecordSchema:
    source = generated.plan.source
    fields = tuple(pa.field(c.name, c.type) for c in source.columns)
    return RecordSchema(fields, source.required, source.event_time)


def _split(start: int, end: int) -> FileSplit:
    return FileSplit("generated", "generator", "generator://seed-7/dt=2026-05-01", start, end, DAY)


def _read_all(router: FormatRouter) -> tuple[list[int], list[int], list[int]]:
    """(row offsets, dead-letter offsets, finished split ids) until the router is empty."""
    rows: list[int] = []
    dead: list[int] = []
    finished: list[int] = []
    ends: dict[bool, int] = {}  # the last block's end, of the replay and the normal read
    while router.has_splits():
        batch = router.fetch()
        for block in batch.blocks:
            assert ends.get(block.replay, block.start) == block.start, "a read's blocks touch"
            ends[block.replay] = block.end
            rows += block.rows.column(OFFSET).to_pylist()
            dead += [offset for offset, _, _ in block.dead]
        finished += batch.finished
    return rows, dead, finished


def test_the_router_reads_a_split_from_its_resume_offset_and_its_replays_exactly() -> None:
    assert isinstance(source_connector_for_split("generator"), GeneratorConnector)
    router = FormatRouter(
        _schema(), max_line_bytes=1 << 20, dsn="", options=generated.plan.source.options
    )
    # In flight at the restored checkpoint: [150, 180); committed up to 190.
    router.add_split(SplitAssignment(4, _split(0, 250), 1, 190, pending=({"span": [150, 180]},)))
    rows, dead, finished = _read_all(router)
    router.close()
    # Every block is replayed ([150, 180)) or after the resume offset, up to the split's end.
    assert rows + dead == [
        *(n for n in range(150, 180) if n % 101 != 100),
        *(n for n in range(190, 250) if n % 101 != 100),
        201,
    ]
    assert dead == [201]
    assert finished == [4]


def test_rows_are_the_oracle() -> None:
    router = FormatRouter(
        _schema(), max_line_bytes=1 << 20, dsn="", options=generated.plan.source.options
    )
    router.add_split(SplitAssignment(1, _split(0, 1000), 1, 0))
    expected = oracle(per_day=1000, days=[0])
    seen = 0
    while router.has_splits():
        for block in router.fetch().blocks:
            for row in block.rows.to_pylist():
                if row["event_type"] != "view":
                    values = (row[name] for name in ("event_id", "user_id", "event_type"))
                    got = (*values, row["amount"], row["event_time"])
                    assert got == expected.rows[row["event_id"]][:5]
                    seen += 1
    router.close()
    assert seen == len(expected.rows)


def test_a_paced_fetch_returns_early_on_wake_up_and_keeps_its_position() -> None:
    options = generated_paced.plan.source.options  # 100 records/s, 100 a block
    reader = GeneratorSplitReader(_schema(), options)
    reader.open(SplitRead(1, _split(0, 250), 0))
    first, done = reader.fetch()  # its slot is now
    assert first is not None and (first.start, first.end, done) == (0, 100, False)
    threading.Timer(0.1, reader.wake_up).start()
    started = time.monotonic()
    woken, done = reader.fetch()  # would wait ~1 s for its slot
    assert woken is None and not done and time.monotonic() - started < 0.5
    second, done = reader.fetch()  # waits out the slot, then goes on where it was
    assert second is not None and (second.start, second.end, done) == (100, 200, False)
    reader.close()
