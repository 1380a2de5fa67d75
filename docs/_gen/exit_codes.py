"""Generates reference/exit-codes.md from ``spark_jobs.ExitCode`` (run by mkdocs-gen-files)."""

from __future__ import annotations

import sys
from pathlib import Path

import mkdocs_gen_files

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from spark_jobs._outcomes import PRECEDENCE, ExitCode

PAGE = "reference/exit-codes.md"


def render() -> str:
    lines = [
        "# Exit codes",
        "",
        "How a `sluice` command (and a Dagster run of a pipeline's job) ended, as one exit "
        "code. The same table is used by the CLI and by the Dagster ops.",
        "",
        "*This page is generated from `spark_jobs.ExitCode`.*",
        "",
        "| code | name | meaning |",
        "|---|---|---|",
    ]
    for member in ExitCode:
        lines.append(f"| `{int(member)}` | `{member.name}` | {member.description} |")
    lines += ["", PRECEDENCE, ""]
    return "\n".join(lines)


with mkdocs_gen_files.open(PAGE, "w") as page:
    page.write(render())
