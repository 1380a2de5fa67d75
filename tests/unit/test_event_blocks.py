"""Blocks of JSON Lines parsed at once give exactly what the per-line path gives.

``parse_lines`` (Arrow's JSON reader behind column checks, halving on failure) must agree with
``parse_event`` line by line on every input: the same events in the same values, the same
dead letters (offset, raw bytes, reason), whatever the mix of good and malformed lines. And
``JsonBlockSplitReader`` must cover the same lines as ``JsonLinesSplitReader`` for any split
boundaries and chunk sizes, with ``read_span`` re-reading a block's range to its events.
"""

from __future__ import annotations

from datetime import UTC
from itertools import pairwise
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from enumerator_service import FileSplit, SplitAssignment
from spark_jobs.source import (
    EventBlock,
    JsonBlockSplitReader,
    JsonLinesSplitReader,
    RawLine,
    parse_event,
    parse_lines,
    read_span,
)

GOOD = {
    "event_id": "e1",
    "user_id": 7,
    "event_time": "2026-01-01T00:00:01.5+00:00",
    "event_type": "click",
    "amount": 2.5,
}
#: Lines the fast path must hand to the per-line path (or agree on), one per tricky case.
ODD_LINES = [
    b"",
    b"   ",
    b"\r",
    b"{not json",
    b"[1, 2]",
    b"5",
    b"{}",
    orjson.dumps({**GOOD, "user_id": None}),
    orjson.dumps({k: v for k, v in GOOD.items() if k != "user_id"}),
    orjson.dumps({**GOOD, "user_id": 1.0}),
    orjson.dumps({**GOOD, "user_id": True}),
    orjson.dumps({**GOOD, "user_id": "7"}),
    orjson.dumps(GOOD).replace(b'"user_id":7', b'"user_id":' + str(1 << 70).encode()),
    orjson.dumps(GOOD).replace(b'"user_id":7', b'"user_id":' + str(1 << 63).encode()),
    orjson.dumps({**GOOD, "amount": "twelve"}),
    orjson.dumps({**GOOD, "amount": 3}),
    orjson.dumps({**GOOD, "amount": False}),
    orjson.dumps({**GOOD, "event_id": ""}),
    orjson.dumps({**GOOD, "event_id": 5}),
    orjson.dumps({**GOOD, "event_type": ""}),
    orjson.dumps({**GOOD, "event_time": "yesterday"}),
    orjson.dumps({**GOOD, "event_time": "2026-02-30T00:00:00+00:00"}),
    orjson.dumps({**GOOD, "event_time": "2026-01-01T00:00:00"}),
    orjson.dumps({**GOOD, "event_time": "2026-01-01 10:00:00Z"}),
    orjson.dumps({**GOOD, "event_time": "2026-01-01T00:00:00+0530"}),
    orjson.dumps({**GOOD, "event_time": "2026-01-01T23:59:59-23:59"}),
    orjson.dumps({**GOOD, "event_time": "0001-01-01T00:00:00+01:00"}),
    orjson.dumps({**GOOD, "extra": {"nested": [1, {"a": None}]}}),
    orjson.dumps(GOOD)[:-1] + b',"extra":NaN}',
    orjson.dumps(GOOD)[:-1] + b',"extra":' + b"9" * 400 + b"}",
    orjson.dumps(GOOD)[:-1] + b',"extra":' + b"[" * 1100 + b"]" * 1100 + b"}",
    orjson.dumps(GOOD).replace(b'"amount":2.5', b'"amount":NaN'),
    orjson.dumps(GOOD).replace(b'"amount":2.5', b'"amount":1e400'),
    orjson.dumps(GOOD).replace(b'"user_id":7', b'"user_id":7,"user_id":8'),
    orjson.dumps(GOOD) + orjson.dumps(GOOD),
    orjson.dumps(GOOD) + b" x",
    orjson.dumps(GOOD).replace(b"click", b"cl\xffck"),
    orjson.dumps(GOOD).replace(b"click", "clïck".encode()),
    orjson.dumps(GOOD)[:-1] + b',"x":"\xff"}',
    b"\xef\xbb\xbf" + orjson.dumps(GOOD),
    orjson.dumps(GOOD) + b"\r",
    b" " + orjson.dumps(GOOD),
    orjson.dumps({**GOOD, "event_type": "x" * 300}),
]


def good_line(i: int) -> bytes:
    return orjson.dumps(
        {
            **GOOD,
            "event_id": f"e{i}",
            "user_id": i,
            "event_time": f"2026-01-01T00:{i % 60:02d}:00+01:00",
        }
    )


def per_line(data: bytes, limit: int) -> tuple[list[tuple[object, ...]], list[object]]:
    """The reference: each line through parse_event, as the per-record reader does."""
    events, dead = [], []
    at = 0
    for text in data.split(b"\n"):
        following = min(at + len(text) + 1, len(data))
        if at >= len(data):
            break
        content = text.removesuffix(b"\r")
        line = RawLine(at, following, content[:limit], len(content) > limit)
        parsed = parse_event(0, line, limit)
        if isinstance(parsed, str):
            dead.append((at, line.data, parsed))
        elif parsed is not None:
            try:
                when = parsed.event_time.astimezone(UTC)
            except OverflowError:
                dead.append((at, line.data, "out of range"))
            else:
                if parsed.user_id >= 1 << 63:
                    dead.append((at, line.data, "out of range"))
                else:
                    events.append((*parsed[1:3], when, *parsed[4:]))
        at = following
    return sorted(events), dead


def blockwise(data: bytes, limit: int) -> tuple[list[tuple[object, ...]], list[object]]:
    batches, dead = parse_lines(0, data, 0, limit)
    events = [
        tuple(row.values())
        for batch in batches
        for row in batch.to_pylist()  # type: ignore[union-attr]
    ]
    normalised = [
        (offset, raw, "out of range" if "out of range" in reason else reason)
        for offset, raw, reason in dead
    ]
    return sorted(events), normalised


@pytest.mark.parametrize("odd", ODD_LINES, ids=range(len(ODD_LINES)))
def test_each_odd_line_among_good_ones_is_handled_as_line_by_line(odd: bytes) -> None:
    lines = [good_line(i) for i in range(40)]
    lines[23] = odd
    data = b"\n".join(lines) + b"\n"
    assert blockwise(data, 1 << 20) == per_line(data, 1 << 20)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kinds=st.lists(st.integers(-1, len(ODD_LINES) - 1), min_size=1, max_size=60),
    limit=st.sampled_from([64, 140, 1 << 20]),
    newline_at_end=st.booleans(),
)
def test_any_mix_of_lines_parses_as_line_by_line(
    kinds: list[int], limit: int, newline_at_end: bool
) -> None:
    lines = [good_line(i) if kind < 0 else ODD_LINES[kind] for i, kind in enumerate(kinds)]
    data = b"\n".join(lines) + (b"\n" if newline_at_end else b"")
    assert blockwise(data, limit) == per_line(data, limit)


def assignment(
    path: Path, start: int, end: int | None, resume: int | None = None
) -> SplitAssignment:
    split = FileSplit("s", "jsonl", str(path), start, end, None)
    return SplitAssignment(1, split, 1, start if resume is None else resume)


def read_lines(reader: JsonLinesSplitReader, a: SplitAssignment) -> list[RawLine]:
    reader.add_split(a)
    out: list[RawLine] = []
    while reader.has_splits():
        for lines in reader.fetch().records.values():
            out.extend(lines)
    return out


def read_blocks(reader: JsonBlockSplitReader, a: SplitAssignment) -> list[EventBlock]:
    reader.add_split(a)
    out: list[EventBlock] = []
    while reader.has_splits():
        for blocks in reader.fetch().records.values():
            out.extend(blocks)
    return out


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    kinds=st.lists(st.integers(-3, len(ODD_LINES) - 1), min_size=1, max_size=40),
    cuts=st.lists(st.floats(0, 1), max_size=3),
    chunk=st.sampled_from([7, 64, 300, 4096]),
    limit=st.sampled_from([100, 1 << 20]),
    tail=st.booleans(),
)
def test_blocks_cover_the_lines_of_the_line_reader(
    tmp_path: Path, kinds: list[int], cuts: list[float], chunk: int, limit: int, tail: bool
) -> None:
    lines = [good_line(i) if k < 0 else ODD_LINES[k] for i, k in enumerate(kinds)]
    data = b"\n".join(lines) + (b"\n" if tail else b"")
    path = tmp_path / "f.jsonl"
    path.write_bytes(data)
    bounds = sorted({0, *(int(c * len(data)) for c in cuts)})
    for start, end in zip(bounds, [*bounds[1:], None], strict=True):
        expected = read_lines(
            JsonLinesSplitReader(max_line_bytes=limit, chunk_bytes=chunk),
            assignment(path, start, end),
        )
        blocks = read_blocks(
            JsonBlockSplitReader(max_line_bytes=limit, chunk_bytes=chunk),
            assignment(path, start, end),
        )
        if expected:
            assert blocks[0].start == expected[0].offset
            assert blocks[-1].end == expected[-1].next_offset
        for before, after in pairwise(blocks):
            assert before.end == after.start
        dead = [entry for block in blocks for entry in block.dead]
        ref_events, ref_dead = [], []
        for line in expected:
            parsed = parse_event(1, line, limit)
            if isinstance(parsed, str):
                ref_dead.append((line.offset, line.data, parsed))
            elif parsed is not None:
                ref_events.append(parsed.event_id)
        events = [e for block in blocks for e in block.rows.column(0).to_pylist()]
        if all(not isinstance(r, str) or "out of range" not in r for *_, r in dead):
            assert sorted(events) == sorted(ref_events)
            assert dead == ref_dead
        # A block's range re-read gives its events again.
        for block in blocks:
            again = read_span(assignment(path, start, end), block.start, block.end, limit)
            assert again.equals(block.rows)
