"""The generated reference holds everything it is generated from: the site is built once
(`mkdocs build`, not strict: the strict build is `make docs` / `make lint`) and every setting,
CLI command, public name, type name, dead-letter category and exit code is looked for in its
built page. The pages are generated, so this holds by construction; the test proves the
generators ran and found what they document."""

from __future__ import annotations

import html
import inspect
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

import dagster_project
import spark_jobs
import spark_jobs.connectors
from enumerator_service import Settings
from spark_jobs import ExitCode
from spark_jobs._dead_letters import CATEGORIES, COLUMNS
from spark_jobs.cli import cli
from spark_jobs.pipeline import _types

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "NO_MKDOCS_2_WARNING": "1",
        "DISABLE_MKDOCS_2_WARNING": "true",
    }
    mkdocs = Path(sys.executable).with_name("mkdocs")
    done = subprocess.run(
        [str(mkdocs), "build", "--quiet", "-d", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def page(site: Path, name: str) -> str:
    return (site / name / "index.html").read_text(encoding="utf-8")


def code(text: str) -> str:
    """How a name in backticks appears in the built HTML."""
    return f"<code>{html.escape(text, quote=False)}</code>"


def command_paths(group: click.Command, prefix: str = "sluice") -> Iterator[str]:
    yield prefix
    if isinstance(group, click.Group):
        for name, command in group.commands.items():
            yield from command_paths(command, f"{prefix} {name}")


def test_every_setting_is_in_the_settings_page(site: Path) -> None:
    text = page(site, "reference/settings")
    names = [f"SLUICE_{field.upper()}" for field in Settings.model_fields]
    assert len(names) > 40
    missing = [name for name in names if f'id="{name.lower()}"' not in text]
    assert missing == []
    for field, info in Settings.model_fields.items():
        assert info.description, f"Settings.{field} has no description"


def test_no_secret_default_is_printed(site: Path) -> None:
    text = page(site, "reference/settings")
    assert "Secret" in text  # the secret fields are marked
    assert "SecretStr" not in text and "**********" not in text


def test_every_cli_command_is_in_the_cli_page(site: Path) -> None:
    text = page(site, "reference/cli")
    paths = list(command_paths(cli))
    assert "sluice db upgrade" in paths and "sluice db shell" in paths
    missing = [path for path in paths if f"{path}<a" not in text and f">{path}<" not in text]
    assert missing == []
    for command in cli.commands.values():  # each command's summary line, and its options
        assert html.escape((command.help or "").split("\n")[0].strip(), quote=False) in text
        for param in command.params:
            if isinstance(param, click.Option):
                assert all(name in text for name in param.opts), param.opts


def test_every_public_name_is_in_the_api_pages(site: Path) -> None:
    pipeline = page(site, "reference/api/pipeline")
    connectors = page(site, "reference/api/connectors")
    missing = [name for name in spark_jobs.__all__ if f'id="spark_jobs.{name}"' not in pipeline]
    missing += [
        name
        for name in spark_jobs.connectors.__all__
        if f'id="spark_jobs.connectors.{name}"' not in connectors
    ]
    missing += [
        name for name in dagster_project.__all__ if f'id="dagster_project.{name}"' not in pipeline
    ]
    assert missing == []


def test_every_type_name_is_in_the_types_page(site: Path) -> None:
    text = page(site, "reference/types")
    names = [*_types._NAMED, *_types.AMBIGUOUS, "decimal(p,s)"]
    missing = [name for name in names if code(name) not in text]
    assert missing == []


def test_every_dead_letter_category_is_in_its_page(site: Path) -> None:
    text = page(site, "reference/dead-letter-reasons")
    missing = [category.name for category in CATEGORIES if code(category.name) not in text]
    missing += [column.name for column in COLUMNS if code(column.name) not in text]
    assert missing == []


def test_every_exit_code_is_in_its_page(site: Path) -> None:
    text = page(site, "reference/exit-codes")
    missing = [
        member.name
        for member in ExitCode
        if code(str(int(member))) not in text or code(member.name) not in text
    ]
    assert missing == []


def _examples(objects: list[object]) -> Iterator[tuple[str, str]]:
    for obj in objects:
        doc = inspect.getdoc(obj) or ""
        for block in re.findall(r"```python\n(.*?)```", doc, re.S):
            yield getattr(obj, "__name__", repr(obj)), block


DOCUMENTED = [getattr(spark_jobs, name) for name in spark_jobs.__all__]
DOCUMENTED += [getattr(spark_jobs.connectors, name) for name in spark_jobs.connectors.__all__]


@pytest.mark.parametrize(("name", "block"), list(_examples(DOCUMENTED)))
def test_docstring_examples_run(name: str, block: str) -> None:
    """The examples in the API reference build what they show (a definition error fails)."""
    exec(compile(block, f"<{name} docstring>", "exec"), {})  # noqa: S102 (our own docstrings)
