"""The ``sluice`` command group. Each command opens the platform, finds the registered
pipelines (``SLUICE_PIPELINES``) and works on one of them (or all, for ``status``).

The commands live in modules by role and are added here: ``_inputs`` (``demo-data``,
``discover``), ``_runs`` (``run``, ``demo``), ``_inspect`` (``pipelines``, ``status``,
``dead-letters``),
``_retry`` (``retry``), ``_db`` (``db …``) and ``_cdc`` (``cdc …``).
"""

from __future__ import annotations

import logging

import click

from enumerator_service import load_settings, sweep_secret_files
from spark_jobs.cli._cdc import cdc
from spark_jobs.cli._common import settings_of
from spark_jobs.cli._db import db
from spark_jobs.cli._inputs import demo_data, discover_cmd
from spark_jobs.cli._inspect import dead_letters_cmd, pipelines_cmd, status_cmd
from spark_jobs.cli._retry import retry_cmd
from spark_jobs.cli._runs import demo, run_cmd

__all__ = ["cli"]


@click.group()
@click.version_option(package_name="sluice", prog_name="sluice")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Sluice: exactly-once pipelines over FLIP-27 sources, async lookups and Postgres.

    Every command works on the pipelines registered with SLUICE_PIPELINES; PIPELINE may be
    left out when exactly one is registered. Settings come from SLUICE_* environment
    variables. Errors are one line on stderr with exit code 2 (usage, configuration,
    definition) or the run's own exit code.
    """
    settings = load_settings()
    logging.basicConfig(level=settings.log_level, format="%(levelname)s %(name)s: %(message)s")
    sweep_secret_files(settings.home_path)  # password files of drivers that were killed
    ctx.obj = settings


for command in (
    db,
    pipelines_cmd,
    demo_data,
    discover_cmd,
    run_cmd,
    status_cmd,
    dead_letters_cmd,
    cdc,
    retry_cmd,
    demo,
):
    cli.add_command(command)


@cli.command("dagster-home")
@click.pass_context
def dagster_home(ctx: click.Context) -> None:
    """Create the Dagster home of the local UI and print its path.

    The folder is SLUICE_HOME/dagster (used by 'make ui'); its dagster.yaml turns telemetry
    and the first-visit dialog off (an existing file is kept, with what it lacks added).
    """
    from spark_jobs.cli._dagster_home import prepare_dagster_home

    click.echo(str(prepare_dagster_home(settings_of(ctx).home_path / "dagster")))
