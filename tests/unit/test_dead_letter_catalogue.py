"""Every dead-letter reason Sluice can emit starts with a category of the catalogue
(``spark_jobs._dead_letters``), from which the documentation's reference is generated.

Two ways: the source is scanned for every reason the code builds (the calls that raise
``FieldError``, the strings that start with a category, the 3-tuples ``(offset, raw, reason)``
appended to dead-letter lists), and the readers are driven with malformed input of every
kind, each reason they give checked against the catalogue.
"""

from __future__ import annotations

import ast
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest

from spark_jobs import _dead_letters as catalogue
from spark_jobs.source import CsvLinesParser, JsonLinesParser, RecordConverter, RecordSchema

ROOT = Path(__file__).resolve().parents[2] / "spark_jobs"
NAMES = {
    name for name in catalogue.__all__ if name.isupper() and name not in {"CATEGORIES", "COLUMNS"}
}
CATEGORY_NAMES = {category.name for category in catalogue.CATEGORIES}


def _modules() -> list[Path]:
    return sorted(path for path in ROOT.rglob("*.py") if path.name != "_dead_letters.py")


def _starts_with_category(node: ast.expr) -> bool:
    """True when a reason expression is built from a catalogue constant: ``LATE``,
    ``f"{WRONG_TYPE}: ..."``, or a name bound to one such string (checked by the caller)."""
    if isinstance(node, ast.Name):
        return True  # a variable: the value it holds is checked where it is built
    if isinstance(node, ast.JoinedStr) and node.values:
        first = node.values[0]
        return (
            isinstance(first, ast.FormattedValue)
            and isinstance(first.value, ast.Name)
            and first.value.id in NAMES
        )
    return False


def test_the_catalogue_is_consistent() -> None:
    names = [category.name for category in catalogue.CATEGORIES]
    assert len(names) == len(set(names))
    assert {getattr(catalogue, name) for name in NAMES} == set(names)
    for category in catalogue.CATEGORIES:
        assert category.meaning and category.emitted_by and category.action
        assert catalogue.category_of(category.example) is category
    assert catalogue.reason(catalogue.LATE) == "late"
    assert catalogue.reason(catalogue.WRONG_TYPE, "x") == "wrong type: x"
    assert catalogue.category_of("something else: x") is None


def test_no_reason_is_spelled_outside_the_catalogue() -> None:
    """No string in the code starts with a category by hand: each is built from its
    constant, so renaming or adding a category happens in the catalogue."""
    found = []
    for path in _modules():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            text = None
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value
            elif isinstance(node, ast.JoinedStr) and node.values:
                first = node.values[0]
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    text = first.value
            if text is not None and catalogue.category_of(text.split("\n")[0]) is not None:
                if text in CATEGORY_NAMES and text == "late":
                    continue  # the word alone ("late") is common; the reason is LATE
                found.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}: {text[:60]!r}")
    assert found == []


def test_every_built_reason_starts_with_a_catalogued_category() -> None:
    """The reasons the code builds: FieldError's argument, the third element of a
    ``(offset, raw, reason)`` tuple appended to a dead-letter list, the text a
    ``parse_line`` returns."""
    unchecked = []
    for path in _modules():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            candidates: list[ast.expr] = []
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "FieldError"
                and node.args
            ):
                candidates.append(node.args[0])
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "append"
                and node.args
                and isinstance(node.args[0], ast.Tuple)
                and len(node.args[0].elts) == 3
                and ast.unparse(node.func.value).rsplit(".", 1)[-1] in {"dead", "letters"}
            ):
                candidates.append(node.args[0].elts[2])
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "dead_letter"
                and len(node.args) == 4
            ):
                candidates.append(node.args[3])
            if isinstance(node, ast.FunctionDef) and node.name == "parse_line":
                candidates.extend(
                    ret.value
                    for ret in ast.walk(node)
                    if isinstance(ret, ast.Return) and isinstance(ret.value, ast.JoinedStr)
                )
            for candidate in candidates:
                if not _starts_with_category(candidate):
                    where = f"{path.relative_to(ROOT.parent)}:{candidate.lineno}"
                    unchecked.append(f"{where}: {ast.unparse(candidate)[:80]}")
    assert unchecked == []


# -- driving the readers ------------------------------------------------------------------

FIELDS = RecordSchema(
    (
        pa.field("s", pa.string()),
        pa.field("i", pa.int8()),
        pa.field("f", pa.float32()),
        pa.field("d", pa.float64()),
        pa.field("b", pa.bool_()),
        pa.field("m", pa.decimal128(5, 2)),
        pa.field("t", pa.timestamp("us", tz="UTC")),
        pa.field("n", pa.timestamp("us")),
        pa.field("day", pa.date32()),
        pa.field("raw", pa.binary()),
    ),
    frozenset({"s"}),
    "t",
)
BAD_VALUES: dict[str, list[Any]] = {
    "s": [5, b"\xff\xfe", True],
    "i": [1.0, True, "5", 300, -(2**70)],
    "f": [True, "x", 1e39, float("inf"), Decimal("NaN")],
    "d": ["1", float("nan"), Decimal("1e400")],
    "b": [1, "true", None],
    "m": [1.234, "abc", "NaN", True, [1], 1e9, Decimal("1e10")],
    "t": ["yesterday", 5, "9999-12-31T23:59:59-05:00"],
    "n": ["nope", 1.5],
    "day": ["2026-13-01", 3],
    "raw": [5, 1.5],
}
BAD_TEXTS: dict[str, list[str]] = {
    "i": ["x", "1.5", "1e999", "99999999999999999999999"],
    "f": ["x", "1e39", "nan", "inf"],
    "d": ["one", "-inf"],
    "b": ["yes", "2"],
    "m": ["x", "1.234", "1e9", "NaN"],
    "t": ["x", "2026-02-30T00:00:00"],
    "n": ["x"],
    "day": ["01/02/2026"],
}


def _assert_catalogued(reasons: list[str]) -> None:
    assert reasons, "no reason was produced"
    stray = [text for text in reasons if catalogue.category_of(text) is None]
    assert stray == []


def _valid() -> dict[str, Any]:
    return {"s": "x"}


def test_record_conversion_reasons_are_catalogued() -> None:
    converter = RecordConverter(FIELDS)
    names = [field.name for field in FIELDS.fields]
    reasons: list[str] = []
    for name, values in BAD_VALUES.items():
        for value in values:
            for out in (
                converter.from_json({**_valid(), name: value}),
                converter.from_values([{**_valid(), name: value}.get(n) for n in names]),
            ):
                if isinstance(out, str):
                    reasons.append(out)
    for name, texts in BAD_TEXTS.items():
        for text in texts:
            out = converter.from_text([{**_valid(), name: text}.get(n) for n in names])
            if isinstance(out, str):
                reasons.append(out)
    missing = converter.from_json({"i": 1})
    assert isinstance(missing, str)
    reasons.append(missing)
    assert len(reasons) > 40
    _assert_catalogued(reasons)
    seen = {catalogue.category_of(text) for text in reasons}
    assert {category.name for category in seen if category} >= {
        catalogue.MISSING_FIELD,
        catalogue.WRONG_TYPE,
        catalogue.BAD_VALUE,
        catalogue.INVALID_UTF8,
    }


JSON_LINES = [
    b"{not json",
    b"[1, 2]",
    b"5",
    b'"text"',
    b"\xff\xfe{}",
    b'{"s": "\xff"}',
    b"{}",
    orjson.dumps({"s": "x", "i": "seven"}),
    orjson.dumps({"s": "x", "m": 1.234}),
    b'{"s": "x", "t": "x"}',
    b"{" + b'"s": "' + b"x" * 200 + b'"}',
]


def test_json_lines_reasons_are_catalogued() -> None:
    parser = JsonLinesParser(FIELDS, max_line_bytes=128)
    data = b"\n".join(JSON_LINES) + b"\n"
    for parse in (parser.parse, parser.parse_exact):
        rows, dead = parse(data, 0)
        assert rows.num_rows == 0
        _assert_catalogued([reason for _, _, reason in dead])
    reasons = [parser.parse_line(line) for line in JSON_LINES]
    reasons.append(parser.parse_line(b"{}", truncated=True))
    _assert_catalogued([text for text in reasons if isinstance(text, str)])


@pytest.mark.parametrize(
    "line",
    [
        b'x,"unbalanced',
        b"a,b",
        b"a,b,c,d,e,f,g,h,i,j,k,l",
        b"\xff,1",
        b"x," + b"9" * 200,
        b'x,"a"b",3',
        b",1",
        b"x,1,1,1,maybe,1,2026-01-01T00:00:00,2026-01-01T00:00:00,2026-01-01,r",
        b"x,1,1,1,true,1,nope,2026-01-01T00:00:00,2026-01-01,r",
    ],
)
def test_csv_reasons_are_catalogued(line: bytes) -> None:
    header = [field.name for field in FIELDS.fields]
    parser = CsvLinesParser(RecordConverter(FIELDS), header, 128)
    reason = parser.parse_line(line)
    assert isinstance(reason, str)
    _assert_catalogued([reason])
    rows, dead = parser.parse(line + b"\n", 100)  # (offset 0 is the header)
    assert rows.num_rows == 0
    _assert_catalogued([text for _, _, text in dead])
    _assert_catalogued([str(parser.parse_line(line, truncated=True))])
