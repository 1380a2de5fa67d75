"""JsonLinesSplitReader: byte-range splits, resume offsets, over-long lines.

The oracle is built from the generated lines themselves (offsets are summed while the file is
written), not by re-parsing the file the way the reader does.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from enumerator_service import FileSplit, SplitAssignment
from spark_jobs.source._jsonl_reader import JsonLinesSplitReader
from spark_jobs.source._records import RawLine

BIG_LIMIT = 1 << 16


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


def raw(expected: list[tuple[int, int, bytes]], limit: int = BIG_LIMIT) -> list[RawLine]:
    return [RawLine(o, n, c[:limit], len(c) > limit) for o, n, c in expected]


@contextmanager
def jsonl_file(data: bytes) -> Iterator[str]:
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "part-0.jsonl")
        Path(path).write_bytes(data)
        yield path


def assignment(
    split_id: int, path: str, start: int, end: int | None, resume: int | None = None
) -> SplitAssignment:
    split = FileSplit("events", "jsonl", path, start, end, None)
    return SplitAssignment(
        split_id, split, epoch=1, resume_offset=start if resume is None else resume
    )


def read_all(
    assignments: list[SplitAssignment], *, chunk: int, limit: int = BIG_LIMIT
) -> dict[int, list[RawLine]]:
    """Lines per split id; checks every split finishes exactly once, in assignment order."""
    reader = JsonLinesSplitReader(max_line_bytes=limit, chunk_bytes=chunk)
    for a in assignments:
        reader.add_split(a)
    lines: dict[int, list[RawLine]] = {a.split_id: [] for a in assignments}
    finished: list[int] = []
    budget = 10 + sum(os.path.getsize(a.split.path) + 2 for a in assignments) * 2
    try:
        while reader.has_splits():
            budget -= 1
            assert budget > 0, "reader makes no progress"
            batch = reader.fetch()
            for split_id, records in batch.records.items():
                assert split_id not in finished, f"lines for split {split_id} after it finished"
                lines[split_id].extend(records)
            finished.extend(batch.finished)
    finally:
        reader.close()
    assert finished == [a.split_id for a in assignments]
    return lines


def read_split(
    path: str,
    start: int,
    end: int | None,
    resume: int | None = None,
    *,
    chunk: int,
    limit: int = BIG_LIMIT,
) -> list[RawLine]:
    return read_all([assignment(7, path, start, end, resume)], chunk=chunk, limit=limit)[7]


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
    with jsonl_file(file_bytes) as path:
        split_lines = read_all(
            [assignment(i, path, s, e) for i, (s, e) in enumerate(bounds)], chunk=chunk
        )
    # Each line comes from the split holding its first byte ...
    for i, (start, end) in enumerate(bounds):
        owned = [x for x in expected if start <= x[0] and (end is None or x[0] < end)]
        assert split_lines[i] == raw(owned), f"split {i} = [{start}, {end})"
    # ... so the union is every line exactly once, in file order.
    union = [line for i in range(len(bounds)) for line in split_lines[i]]
    assert union == raw(expected)


@PROPERTY_SETTINGS
@given(lines=files(), chunk=st.integers(1, 16))
def test_resume_from_any_next_offset_yields_exactly_the_remaining_lines(
    lines: list[Line], chunk: int
) -> None:
    file_bytes, expected = build(lines)
    with jsonl_file(file_bytes) as path:
        emitted = read_split(path, 0, None, chunk=chunk)
        assert emitted == raw(expected)
        for i, line in enumerate(emitted):
            resumed = read_split(path, 0, None, resume=line.next_offset, chunk=chunk)
            assert resumed == emitted[i + 1 :], f"resume from {line.next_offset}"


@PROPERTY_SETTINGS
@given(lines=files(), data=st.data(), chunk=st.integers(1, 16))
def test_resume_inside_a_mid_file_split(lines: list[Line], data: st.DataObject, chunk: int) -> None:
    file_bytes, expected = build(lines)
    size = len(file_bytes)
    start = data.draw(st.integers(0, size), label="start")
    end = data.draw(st.integers(start, size), label="end")
    with jsonl_file(file_bytes) as path:
        emitted = read_split(path, start, end, chunk=chunk)
        assert emitted == raw([x for x in expected if start <= x[0] < end])
        for i, line in enumerate(emitted):
            resumed = read_split(path, start, end, resume=line.next_offset, chunk=chunk)
            assert resumed == emitted[i + 1 :], f"resume from {line.next_offset}"


@PROPERTY_SETTINGS
@given(lines=files(), limit=st.integers(1, 10), chunk=st.integers(1, 16))
def test_truncation_does_not_depend_on_chunk_size(
    lines: list[Line], limit: int, chunk: int
) -> None:
    """A line is truncated iff its content (without its line ending) exceeds the limit."""
    file_bytes, expected = build(lines)
    with jsonl_file(file_bytes) as path:
        assert read_split(path, 0, None, chunk=chunk, limit=limit) == raw(expected, limit)


# -- over-long lines -------------------------------------------------------------------------


@pytest.mark.parametrize("chunk", [1, 3, 8, 13, 64, 1 << 20])
def test_over_long_lines_are_truncated_and_following_lines_intact(chunk: int) -> None:
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
        out = read_split(path, 0, None, chunk=chunk, limit=limit)
    assert [line.truncated for line in out] == [False, True, False, True, False, False, True]
    assert out[1] == RawLine(expected[1][0], expected[1][1], b'{"long":', True)
    assert out[3].data == "漢".encode() * 2 + "漢".encode()[:2]
    assert out[6] == RawLine(expected[6][0], len(file_bytes), b"z" * 8, True)
    assert out == raw(expected, limit)


@pytest.mark.parametrize("chunk", [1, 2, 3, 4, 5, 6, 64])
def test_crlf_line_of_exactly_the_limit_is_not_truncated(chunk: int) -> None:
    """Content of exactly ``max_line_bytes`` is within the limit, whatever the line ending."""
    file_bytes = b"abc\r\nxy\n"
    with jsonl_file(file_bytes) as path:
        out = read_split(path, 0, None, chunk=chunk, limit=3)
    assert out == [RawLine(0, 5, b"abc", False), RawLine(5, 8, b"xy", False)]


def test_split_starting_inside_an_over_long_line_skips_it() -> None:
    file_bytes, expected = build(
        [Line(b"a" * 50, b"\n"), Line(b"bb", b"\n"), Line(b"c" * 50, b"\n"), Line(b"dd", b"")]
    )
    with jsonl_file(file_bytes) as path:
        first = read_split(path, 0, 10, chunk=4, limit=8)
        second = read_split(path, 10, None, chunk=4, limit=8)
    assert first == raw(expected[:1], 8)
    assert second == raw(expected[1:], 8)
