"""LineSplitReader on JSON Lines: byte-range splits, resume offsets, over-long lines.

The oracle is built from the generated lines themselves (offsets are summed while the file is
written), not by re-reading the file the way the reader does. Each line's fate (row or dead
letter) is the exact per-line path's; what is tested here is which lines a read covers.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from source_schemas import file_assignment, read_blocks

from spark_jobs.source import (
    OFFSET,
    JsonLinesParser,
    LineSplitReader,
    ParsedBlock,
    RecordSchema,
    SplitRead,
)

BIG_LIMIT = 1 << 16
#: Any JSON object is a row (``a`` null when absent); anything else a dead letter.
LOOSE = RecordSchema((pa.field("a", pa.string()),))

Record = tuple[int, bytes | None, str | None]  # offset, raw (dead letters), reason


@dataclass(frozen=True)
class Line:
    content: bytes
    eol: bytes  # b"\n", b"\r\n", or b"" for a last line without a newline


def build(lines: list[Line]) -> tuple[bytes, list[tuple[int, int, bytes]]]:
    """The file bytes and, per line, (offset, next_offset, content)."""
    data = b""
    expected: list[tuple[int, int, bytes]] = []
    for line in lines:
        offset = len(data)
        data += line.content + line.eol
        expected.append((offset, len(data), line.content))
    return data, expected


def oracle(expected: list[tuple[int, int, bytes]], limit: int = BIG_LIMIT) -> list[Record]:
    """What a read of these lines emits: rows (offset) and dead letters, blank lines none."""
    parser = JsonLinesParser(LOOSE, limit)
    out: list[Record] = []
    for offset, _, content in expected:
        parsed = parser.parse_line(content[:limit], len(content) > limit)
        if isinstance(parsed, str):
            out.append((offset, content[:limit], parsed))
        elif parsed is not None:
            out.append((offset, None, None))
    return out


def records(blocks: list[ParsedBlock]) -> list[Record]:
    out: list[Record] = [
        (offset, None, None) for block in blocks for offset in block.rows.column(OFFSET).to_pylist()
    ]
    out.extend((offset, raw, reason) for block in blocks for offset, raw, reason in block.dead)
    return sorted(out, key=lambda record: record[0])


@contextmanager
def jsonl_file(data: bytes) -> Iterator[str]:
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "part-0.jsonl")
        Path(path).write_bytes(data)
        yield path


def read_split(
    path: str,
    start: int,
    end: int | None,
    resume: int | None = None,
    *,
    chunk: int,
    limit: int = BIG_LIMIT,
) -> list[ParsedBlock]:
    reader = LineSplitReader(LOOSE, max_line_bytes=limit, chunk_bytes=chunk)
    blocks = read_blocks(reader, SplitRead.of(file_assignment(7, path, start, end, resume)))
    for block in blocks:
        assert block.split_id == 7 and not block.replay
    return blocks


# -- strategies ------------------------------------------------------------------------------

content_strategy = st.text(alphabet='ab{}":,é漢 ', max_size=12).map(str.encode)
line_strategy = st.builds(Line, content_strategy, st.sampled_from([b"\n", b"\r\n"]))


@st.composite
def files(draw: st.DrawFn, max_lines: int = 10) -> list[Line]:
    lines = draw(st.lists(line_strategy, max_size=max_lines))
    if lines and lines[-1].content and draw(st.booleans()):
        lines[-1] = Line(lines[-1].content, b"")  # last line without a trailing newline
    return lines


PROPERTY_SETTINGS = settings(database=None, deadline=None, max_examples=200)


# -- properties ------------------------------------------------------------------------------


@PROPERTY_SETTINGS
@given(lines=files(), data=st.data(), chunk=st.integers(1, 16))
def test_splits_yield_every_line_exactly_once_in_order(
    lines: list[Line], data: st.DataObject, chunk: int
) -> None:
    file_bytes, expected = build(lines)
    size = len(file_bytes)
    cuts = sorted(data.draw(st.lists(st.integers(0, size), max_size=5), label="cuts"))
    last_end = data.draw(st.sampled_from([None, size]), label="last end")
    bounds: list[tuple[int, int | None]] = list(zip([0, *cuts], [*cuts, last_end], strict=True))
    union: list[Record] = []
    with jsonl_file(file_bytes) as path:
        for start, end in bounds:
            blocks = read_split(path, start, end, chunk=chunk)
            # Each line comes from the split holding its first byte ...
            owned = [x for x in expected if start <= x[0] and (end is None or x[0] < end)]
            assert records(blocks) == oracle(owned), f"split [{start}, {end})"
            if owned:
                assert blocks[0].start == owned[0][0] and blocks[-1].end == owned[-1][1]
            union.extend(records(blocks))
    # ... so the union is every line exactly once, in file order.
    assert union == oracle(expected)


@PROPERTY_SETTINGS
@given(lines=files(), chunk=st.integers(1, 16))
def test_resume_from_any_block_end_yields_exactly_the_remaining_lines(
    lines: list[Line], chunk: int
) -> None:
    file_bytes, expected = build(lines)
    with jsonl_file(file_bytes) as path:
        blocks = read_split(path, 0, None, chunk=chunk)
        assert records(blocks) == oracle(expected)
        for _, after, _ in expected:  # every line end is a possible resume offset
            resumed = read_split(path, 0, None, resume=after, chunk=chunk)
            assert records(resumed) == oracle([x for x in expected if x[0] >= after])


@PROPERTY_SETTINGS
@given(lines=files(), data=st.data(), chunk=st.integers(1, 16))
def test_resume_inside_a_mid_file_split(lines: list[Line], data: st.DataObject, chunk: int) -> None:
    file_bytes, expected = build(lines)
    size = len(file_bytes)
    start = data.draw(st.integers(0, size), label="start")
    end = data.draw(st.integers(start, size), label="end")
    owned = [x for x in expected if start <= x[0] < end]
    with jsonl_file(file_bytes) as path:
        assert records(read_split(path, start, end, chunk=chunk)) == oracle(owned)
        for block in read_split(path, start, end, chunk=chunk):
            resumed = read_split(path, start, end, resume=block.end, chunk=chunk)
            assert records(resumed) == oracle([x for x in owned if x[0] >= block.end])


@PROPERTY_SETTINGS
@given(lines=files(), limit=st.integers(1, 10), chunk=st.integers(1, 16))
def test_truncation_does_not_depend_on_chunk_size(
    lines: list[Line], limit: int, chunk: int
) -> None:
    """A line is too long iff its content (without its line ending) exceeds the limit."""
    file_bytes, expected = build(lines)
    with jsonl_file(file_bytes) as path:
        assert records(read_split(path, 0, None, chunk=chunk, limit=limit)) == oracle(
            expected, limit
        )


# -- over-long lines -------------------------------------------------------------------------


def too_long(limit: int) -> str:
    return f"line too long: over {limit} bytes"


@pytest.mark.parametrize("chunk", [1, 3, 8, 13, 64, 1 << 20])
def test_over_long_lines_are_dead_letters_and_following_lines_intact(chunk: int) -> None:
    limit = 8
    lines = [
        Line(b'{"a":1}', b"\n"),
        Line(b'{"long":"' + b"x" * 40 + b'"}', b"\n"),
        Line(b'{"b":2}', b"\r\n"),
        Line("漢".encode() * 5, b"\r\n"),  # 15 bytes, cut inside a character
        Line(b"", b"\n"),
        Line(b'{"c":3}', b"\n"),
        Line(b"z" * 30, b""),  # over-long last line without a newline
    ]
    file_bytes, expected = build(lines)
    with jsonl_file(file_bytes) as path:
        out = records(read_split(path, 0, None, chunk=chunk, limit=limit))
    assert out == [
        (expected[0][0], b'{"a":1}', "wrong type: a must be a string"),
        (expected[1][0], b'{"long":', too_long(limit)),
        (expected[2][0], None, None),
        (expected[3][0], "漢".encode() * 2 + "漢".encode()[:2], too_long(limit)),
        (expected[5][0], None, None),
        (expected[6][0], b"z" * 8, too_long(limit)),
    ]
    assert out == oracle(expected, limit)


@pytest.mark.parametrize("chunk", [1, 2, 3, 4, 5, 6, 64])
def test_crlf_line_of_exactly_the_limit_is_not_truncated(chunk: int) -> None:
    """Content of exactly ``max_line_bytes`` is within the limit, whatever the line ending."""
    with jsonl_file(b"{ }\r\n{}\n") as path:
        blocks = read_split(path, 0, None, chunk=chunk, limit=3)
    assert records(blocks) == [(0, None, None), (5, None, None)]
    assert blocks[-1].end == 8


def test_split_starting_inside_an_over_long_line_skips_it() -> None:
    file_bytes, expected = build(
        [Line(b"a" * 50, b"\n"), Line(b"{}", b"\n"), Line(b"c" * 50, b"\n"), Line(b"{}", b"")]
    )
    with jsonl_file(file_bytes) as path:
        first = read_split(path, 0, 10, chunk=4, limit=8)
        second = read_split(path, 10, None, chunk=4, limit=8)
    assert records(first) == oracle(expected[:1], 8) == [(0, b"a" * 8, too_long(8))]
    assert records(second) == oracle(expected[1:], 8)
    assert (second[0].start, second[-1].end) == (51, len(file_bytes))


def test_wake_up_returns_early_without_losing_lines() -> None:
    with jsonl_file(b"{}\n" * 10) as path:
        reader = LineSplitReader(LOOSE, max_line_bytes=10, chunk_bytes=4)
        reader.open(SplitRead.of(file_assignment(1, path, 0, None)))
        reader.wake_up()  # a wake-up before a fetch is cleared by it
        blocks = []
        while True:
            block, done = reader.fetch()
            blocks.extend([block] if block is not None else [])
            if done:
                break
        reader.close()
        assert [o for o, _, _ in records(blocks)] == list(range(0, 30, 3))
        assert reader.fetch() == (None, True)
