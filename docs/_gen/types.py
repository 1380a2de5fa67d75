"""Generates reference/types.md from the schema language's type table,
``spark_jobs.pipeline._types`` (run by mkdocs-gen-files): every name a field type can be
written with, its Arrow type, the Postgres column type a sink creates for it and the Spark SQL
type it has when the output is read by Spark (pyspark's own Arrow mapping)."""

from __future__ import annotations

import sys
from pathlib import Path

import mkdocs_gen_files
import pyarrow as pa
from pyspark.sql.pandas.types import from_arrow_type

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from spark_jobs.pipeline import _types

PAGE = "reference/types.md"

INTRO = """\
# Types

A field type in a pipeline's `schema`, `output` or lookup is written as one of the names
below (case-insensitive), as `decimal(p,s)`, or given as the `pyarrow.DataType` itself. Only
these types are accepted: every reader, lookup and sink carries them exactly. Messages print
a type by its name in the first column.

```python
from spark_jobs import FileSource

source = FileSource(
    schema={"order_id": "int64", "amount": "decimal(12,2)", "ts": "timestamp", "note": "string"},
    required=["order_id", "ts"],
    event_time="ts",
)
```

*This page is generated from `spark_jobs.pipeline._types`.*

| name | aliases | Arrow type | Postgres column | Spark SQL type |
|---|---|---|---|---|
"""


def render() -> str:
    names: dict[str, list[str]] = {}
    kinds: dict[str, pa.DataType] = {}
    for name, kind in _types._NAMED.items():
        shown = _types.type_name(kind)
        kinds[shown] = kind
        if name != shown:
            names.setdefault(shown, []).append(name)
        else:
            names.setdefault(shown, [])
    rows = []
    for shown, aliases in names.items():
        kind = kinds[shown]
        alias_text = ", ".join(f"`{alias}`" for alias in aliases)
        rows.append(
            f"| `{shown}` | {alias_text} | `{kind}` | `{_types.postgres_type(kind)}` | "
            f"`{from_arrow_type(kind).simpleString()}` |"
        )
    example = pa.decimal128(12, 2)
    rows.append(
        "| `decimal(p,s)` (1 ≤ p ≤ 38, 0 ≤ s ≤ p) | | `decimal128(p, s)` | `numeric(p,s)` | "
        "`decimal(p,s)` |"
    )
    assert _types.postgres_type(example) == "numeric(12,2)"
    refused = _types.AMBIGUOUS
    text = INTRO + "\n".join(rows) + "\n"
    text += (
        "\n`timestamp` values are UTC instants (text without an offset is read as UTC); "
        "`timestamp_naive` keeps wall-clock times without a zone.\n"
    )
    if refused:
        text += (
            "\n## Refused names\n\nThese names are ambiguous and fail the definition with "
            "this message:\n\n| name | message |\n|---|---|\n"
        )
        for name, message in refused.items():
            text += f"| `{name}` | {message} |\n"
    text += _catalog()
    return text


def _catalog() -> str:
    lines = [
        "",
        "## Postgres columns read by lookups and table sources",
        "",
        "A `Lookup` and a `TableSource` read a table's columns with these types "
        "(`format_type` of the catalog); any other column type is read as text "
        "(`column::text`).",
        "",
        "| Postgres type | read as |",
        "|---|---|",
    ]
    for sql_type, kind in _types._CATALOG_EXACT.items():
        lines.append(f"| `{sql_type}` | `{_types.type_name(kind)}` |")
    lines.append("| `numeric(p,s)`, p ≤ 38 | `decimal(p,s)` |")
    lines.append("| `character varying`, `character(n)` | `string` |")
    return "\n".join(lines) + "\n"


with mkdocs_gen_files.open(PAGE, "w") as page:
    page.write(render())
