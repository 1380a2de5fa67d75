"""Generates reference/dead-letter-reasons.md from the catalogue in
``spark_jobs._dead_letters`` (run by mkdocs-gen-files)."""

from __future__ import annotations

import sys
from pathlib import Path

import mkdocs_gen_files

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from spark_jobs._dead_letters import CATEGORIES, COLUMNS

PAGE = "reference/dead-letter-reasons.md"

INTRO = """\
# Dead-letter reasons

A *dead letter* is a record Sluice could not turn into an output row. The run goes on
without it and keeps it, with its reason, in the platform database's table
`sluice.dead_letters`, committed with the same checkpoint as the output: a record is either
in the output or a dead letter, never both and never lost. `sluice status` counts dead letters
by reason; a rebuild of a day (`sluice run --date D --replace`) replaces that day's dead letters.

A reason is `<category>: <detail>`, e.g. `wrong type: amount must be a number, got 'n/a'`
(`late` has no detail). `sluice dead-letters PIPELINE` lists them — per day and reason, then
each one with its place, reason and raw input (`--date`, `--reason`, `--limit`, `--json`).
In SQL:

```sql
select reason, count(*) from sluice.dead_letters where source = 'orders' group by reason;
select "offset", encode(raw, 'escape') as raw, reason
  from sluice.dead_letters where source = 'orders' order by id desc limit 20;
```

*This page is generated from the catalogue `spark_jobs._dead_letters`; a unit test checks that
every reason the code emits starts with one of these categories.*

## Categories

| category | meaning |
|---|---|
"""


def _anchor(name: str) -> str:
    return name.lower().replace(" ", "-").replace("_", "-")


def render() -> str:
    rows = [
        f"| [`{category.name}`](#{_anchor(category.name)}) | {category.meaning} |"
        for category in CATEGORIES
    ]
    sections = [
        f"### `{category.name}` {{#{_anchor(category.name)}}}\n\n{category.meaning}\n\n"
        f"- **emitted by:** {category.emitted_by}\n"
        f"- **example:** `{category.example}`\n"
        f"- **what to do:** {category.action}\n"
        for category in CATEGORIES
    ]
    columns = ["| column | type | meaning |", "|---|---|---|"] + [
        f"| `{column.name}` | `{column.type}` | {column.meaning} |" for column in COLUMNS
    ]
    return (
        INTRO
        + "\n".join(rows)
        + "\n\n"
        + "\n".join(sections)
        + "\n## The `sluice.dead_letters` table\n\n"
        + "\n".join(columns)
        + "\n"
    )


with mkdocs_gen_files.open(PAGE, "w") as page:
    page.write(render())
