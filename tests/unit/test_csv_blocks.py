"""The CSV fast path (``_csv_blocks``) gives exactly the exact per-line path's rows and dead
letters: ``CsvLinesParser.parse`` against ``CsvLinesParser.parse_exact`` on the same bytes."""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_jobs.source import OFFSET, CsvLinesParser, RecordConverter, RecordSchema
from spark_jobs.source._csv_blocks import EXACT_LINES

SCHEMA = RecordSchema(
    (
        pa.field("order_id", pa.string()),
        pa.field("tenant_id", pa.int64()),
        pa.field("qty", pa.int16()),
        pa.field("amount", pa.decimal128(12, 2)),
        pa.field("rate", pa.float64()),
        pa.field("weight", pa.float32()),
        pa.field("ordered_at", pa.timestamp("us", tz="UTC")),
        pa.field("shipped", pa.timestamp("us")),
        pa.field("day", pa.date32()),
        pa.field("note", pa.string()),
        pa.field("absent", pa.string()),
    ),
    required=("order_id", "tenant_id", "amount", "ordered_at"),
)
HEADER = [
    "order_id",
    "tenant_id",
    "qty",
    "amount",
    "rate",
    "weight",
    "ordered_at",
    "shipped",
    "day",
    "note",
    "extra",
]
LIMIT = 200


def _parser() -> CsvLinesParser:
    return CsvLinesParser(RecordConverter(SCHEMA), HEADER, LIMIT)


def _good(i: int) -> list[str]:
    return [
        f"o-{i}",
        str(i % 7),
        str(i % 300 - 150),
        f"{i % 1000}.{i % 100:02d}",
        f"{i / 8}",
        f"{i % 50}.25",
        f"2026-01-{1 + i % 28:02d}T10:{i % 60:02d}:00" + ("Z" if i % 2 else "+02:00"),
        "" if i % 3 else "2026-02-03 04:05:06.789",
        f"2026-03-{1 + i % 28:02d}",
        "" if i % 5 else f"note {i} é",
        "ignored",
    ]


#: Lines the fast path must not take as they are (each goes, or makes its piece go, exactly).
BAD_LINES = [
    b"o-x,1,2,3.00,1.5,1,2026-01-01T00:00:00Z,,2026-01-01,,x,too many",  # field count
    b"o-x,1,2,3.001,1.5,1,2026-01-01T00:00:00Z,,2026-01-01,,x",  # decimal digits
    b"o-x,1,99999,3.00,1.5,1,2026-01-01T00:00:00Z,,2026-01-01,,x",  # int16 range
    b"o-x,,2,3.00,1.5,1,2026-01-01T00:00:00Z,,2026-01-01,,x",  # missing required
    b"o-x,1,2,3.00,1.5,1,not a time,,2026-01-01,,x",
    b"o-x,1,2,3.00,1.5,1,2026-01-01T00:00:00Z,,2026-02-30,,x",  # impossible day
    b'o-x,1,2,3.00,1.5,1,2026-01-01T00:00:00Z,,2026-01-01,"quoted, comma",x',  # good, quoted
    b'o-x,1,2,3.00,1.5,1,2026-01-01T00:00:00Z,,2026-01-01,"open,x',  # unbalanced
    b"o-x,1,2,3.00,1.5,1,2026-01-01T00:00:00Z,,2026-01-01,,\xff",  # invalid UTF-8 (extra)
    b"o-x, 1 ,+2,3.0,1e3,nan,2026-01-01 00:00:00,,2026-01-01,,x",  # exact accepts, fast not
    b"o-x,1,2,3.00,1.5,1,2026-01-01T00:00:00Z,,2026-01-01,,x\r",  # CRLF
    b"",  # blank
    b"   ",  # whitespace only
    b"o-x,1,2,3.00,1.5,1,2026-01-01T00:00:00Z,,2026-01-01," + b"y" * LIMIT + b",x",  # long
    b"o-x,1,2,3.00,1.5,1e39,2026-01-01T00:00:00Z,,2026-01-01,,x",  # float32 overflow
    b"o-x,1,2,3.00,1.5,1,0999-01-01T00:00:00Z,,2026-01-01,,x",  # outside the strict years
]


def _block(lines: list[bytes], final_newline: bool = True) -> bytes:
    return b"\n".join(lines) + (b"\n" if final_newline else b"")


def _same(parser: CsvLinesParser, data: bytes, offset: int) -> tuple[pa.RecordBatch, list[Any]]:
    fast_rows, fast_dead = parser.parse(data, offset)
    exact_rows, exact_dead = parser.parse_exact(data, offset)
    assert fast_rows.schema.equals(exact_rows.schema)
    assert fast_rows.to_pylist() == exact_rows.to_pylist()
    assert fast_dead == exact_dead
    return fast_rows, fast_dead


def _counting(parser: CsvLinesParser) -> list[int]:
    """Counts the lines the exact path parses (one ``parse_line`` each)."""
    calls = [0]
    line = parser.parse_line

    def counted(content: bytes, truncated: bool = False) -> Any:
        calls[0] += 1
        return line(content, truncated)

    parser.parse_line = counted  # type: ignore[method-assign]
    return calls


def test_a_clean_block_is_parsed_column_wise_with_the_same_rows() -> None:
    parser = _parser()
    data = _block([",".join(_good(i)).encode() for i in range(2000)])
    calls = _counting(parser)
    rows, dead = _same(parser, data, 4096)
    assert (rows.num_rows, dead) == (2000, [])
    assert calls[0] == 2000  # parse_exact's, not parse's: the fast path took every line


@pytest.mark.parametrize("bad", BAD_LINES)
def test_one_bad_line_in_the_middle_gives_the_same_rows_and_dead_letter(bad: bytes) -> None:
    parser = _parser()
    lines = [",".join(_good(i)).encode() for i in range(1000)]
    lines.insert(500, bad)
    data = _block(lines, final_newline=False)
    calls = _counting(parser)
    rows, dead = parser.parse(data, 10)
    fast_calls = calls[0]
    # Only the bad line (a suspect value) or its small piece (a line Arrow cannot pair with
    # a row) goes line by line.
    assert fast_calls <= EXACT_LINES
    exact_rows, exact_dead = parser.parse_exact(data, 10)
    assert rows.to_pylist() == exact_rows.to_pylist()
    assert dead == exact_dead
    bad_offset = 10 + sum(len(line) + 1 for line in lines[:500])
    assert [d[0] for d in dead] in ([], [bad_offset])
    assert [d[1] for d in dead] in ([], [bad[:LIMIT].removesuffix(b"\r")])


def test_the_header_line_at_offset_zero_is_skipped() -> None:
    parser = _parser()
    data = _block([",".join(HEADER).encode(), *(",".join(_good(i)).encode() for i in range(50))])
    rows, _ = _same(parser, data, 0)
    assert rows.num_rows == 50
    assert rows.column(OFFSET)[0].as_py() == len(",".join(HEADER)) + 1


def test_a_required_field_missing_from_the_header_goes_the_exact_way() -> None:
    parser = CsvLinesParser(RecordConverter(SCHEMA), [h for h in HEADER if h != "amount"], LIMIT)
    kept = [h != "amount" for h in HEADER]
    lines = [
        ",".join(v for keep, v in zip(kept, _good(i), strict=True) if keep).encode()
        for i in range(40)
    ]
    rows, dead = _same(parser, _block(lines), 7)
    assert (rows.num_rows, len(dead)) == (0, 40)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 3 * len(BAD_LINES)), min_size=1, max_size=120), st.integers(0, 99))
def test_any_mix_of_good_and_bad_lines_parses_as_the_exact_path(
    picks: list[int], seed: int
) -> None:
    rng = random.Random(seed)
    lines = [
        BAD_LINES[p] if p < len(BAD_LINES) else ",".join(_good(rng.randrange(10**6))).encode()
        for p in picks
    ]
    _same(_parser(), _block(lines, final_newline=bool(seed % 2)), 1 + seed)
