"""What the ``sluice`` commands share: the console, the settings the group loaded, opening the
platform, choosing a pipeline, and the ``--date`` option.

Threading: the CLI runs on one thread; nothing here is shared across threads.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from datetime import date
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from enumerator_service import Platform, Settings, open_platform, partition_date
from spark_jobs.pipeline import Pipeline
from spark_jobs.pipeline._registry import load_pipelines, pick_pipeline

__all__ = [
    "console",
    "date_option",
    "dates_of",
    "open_for",
    "pipeline_named",
    "progress_bar",
    "settings_of",
]

#: The console's width when the output is piped or redirected and ``COLUMNS`` is not set.
PIPED_WIDTH = 200


def _width() -> int | None:
    """None (the terminal's width) on a terminal or with ``COLUMNS``; else
    :data:`PIPED_WIDTH` — rich's 80 columns wrapped paths, fields and error lines inside the
    tables' cells, splitting what a ``grep`` or a log needs on one line."""
    if os.environ.get("COLUMNS") or sys.stdout.isatty():
        return None
    return PIPED_WIDTH


console = Console(highlight=False, width=_width())


def settings_of(ctx: click.Context) -> Settings:
    """The settings the ``sluice`` group loaded (``ctx.obj``, inherited by subcommands)."""
    settings = ctx.obj
    assert isinstance(settings, Settings)
    return settings


def progress_bar() -> Progress:
    """A progress display on the console: description, bar, done/total, elapsed time."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )


def open_for(settings: Settings, *, migrate: bool = False) -> Platform:
    """The platform; ``migrate`` only for the commands that set it up (``db upgrade``,
    ``demo``, ``run``): the others never create a database nor change its schema, and fail
    with one line when it is missing or behind."""
    if not migrate:
        with console.status("Connecting to Postgres…"):
            return open_platform(settings, migrate=False)
    with console.status("Connecting to Postgres and applying migrations…"):
        return open_platform(settings, migrate=True)


def pipeline_named(settings: Settings, name: str | None) -> Pipeline:
    """The registered pipeline ``name`` (None: the only one registered)."""
    return pick_pipeline(load_pipelines(settings), name)


def dates_of(values: Sequence[str]) -> list[date] | None:
    """The ``--date`` values as days (each becomes a ``dt=`` folder): one ConfigError line
    naming ``--date`` for anything that is not ``YYYY-MM-DD``."""
    if not values:
        return None
    return [partition_date(v, "--date") for v in values]


#: A click command function (what ``date_option`` decorates).
F = TypeVar("F", bound=Callable[..., Any])


def date_option(help: str) -> Callable[[F], F]:
    """``--date`` (repeatable, ``YYYY-MM-DD``) with the command's own ``help``."""
    return click.option("--date", "dates", multiple=True, metavar="YYYY-MM-DD", help=help)
