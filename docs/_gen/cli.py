"""Generates reference/cli.md: mkdocs-click over the ``sluice`` click group (run by
mkdocs-gen-files). The commands' docstrings and option help are the single source."""

from __future__ import annotations

import mkdocs_gen_files

PAGE = "reference/cli.md"

TEXT = """\
# CLI

The `sluice` command drives discovery and runs for the pipelines registered with
`SLUICE_PIPELINES` (see [Settings](settings.md)). `PIPELINE` may be left out when exactly one
pipeline is registered. Exit codes: [Exit codes](exit-codes.md).

*This page is generated from the click commands of `spark_jobs.cli`.*

::: mkdocs-click
    :module: spark_jobs.cli
    :command: cli
    :prog_name: sluice
    :style: plain
    :list_subcommands: true
    :depth: 1
"""

with mkdocs_gen_files.open(PAGE, "w") as page:
    page.write(TEXT)
