"""The password never surfaces: URL forms by the places a URL can show up.

Places: connection errors (``connect_engine``, the CLI's one-line error), logs at DEBUG,
``sluice db upgrade`` and ``sluice status --json`` output, a Spark run (what the driver logs,
and a task's failure as it comes back to the driver), and Dagster (event metadata, failures,
run tags). The database is a private server that checks passwords (``secret_postgres``), so a
run that works proves the password reached every connection, executors included.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from dagster import AssetSelection, Definitions, define_asset_job
from secret_postgres import PasswordServer, password_server
from url_forms import FORMS, Form, assert_hidden

from dagster_project.observations import table_asset
from dagster_project.resources import DatabaseResource, SluiceResource
from enumerator_service import ConfigError, connect_engine, database_url, load_settings
from spark_jobs import FileSource, Map, ParquetSink, Pipeline
from spark_jobs.connectors.parquet import output_path
from spark_jobs.jobs import run_pipeline

SLUICE = str(Path(sys.executable).with_name("sluice"))
BY_NAME = {form.name: form for form in FORMS}
WITH_PASSWORD = [form for form in FORMS if form.password is not None]
#: The hardest form: every special character, percent-encoded in the URL.
HARD = BY_NAME["all of them"]


@pytest.fixture(scope="module")
def server() -> Iterator[PasswordServer]:
    with password_server() as private:
        yield private


def _url(server: PasswordServer, form: Form) -> str:
    assert form.password is not None
    server.use(form.password)
    return form.url(server.at())


# -- errors and logs -------------------------------------------------------------------------


@pytest.mark.parametrize("form", FORMS, ids=[f.name for f in FORMS])
def test_connection_errors_and_debug_logs_hide_the_password(
    form: Form, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with pytest.raises(ConfigError) as caught:  # nothing listens on port 9
        connect_engine(database_url(load_settings(database_url=form.url("127.0.0.1:9/app"))))
    message = str(caught.value)
    assert message.startswith("SLUICE_DATABASE_URL: cannot connect to postgresql")
    assert "127.0.0.1" in message
    assert_hidden(message, form)
    assert_hidden(caplog.text, form)


@pytest.mark.parametrize("form", WITH_PASSWORD[:4], ids=[f.name for f in WITH_PASSWORD[:4]])
def test_a_wrong_password_is_refused_without_showing_it(server: PasswordServer, form: Form) -> None:
    server.use("the-right-one")
    with pytest.raises(ConfigError) as caught:
        connect_engine(database_url(load_settings(database_url=form.url(server.at()))))
    assert "password authentication failed" in str(caught.value)
    assert_hidden(str(caught.value), form)


def _cli(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    return subprocess.run(
        [SLUICE, *args], env={**clean, **env}, cwd=cwd, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("name", ["slash raw", "all of them", "query password"])
def test_cli_db_upgrade_and_status_json_at_debug(
    server: PasswordServer, name: str, tmp_path: Path
) -> None:
    form = BY_NAME[name]
    (tmp_path / "secret_pipes.py").write_text(
        "from spark_jobs import FileSource, Pipeline\n"
        'pipe = Pipeline(name="secret_pipe", source=FileSource(schema={"x": "int64"}))\n'
    )
    env = {
        "SLUICE_PIPELINES": "secret_pipes",
        "SLUICE_DATABASE_URL": _url(server, form),
        "SLUICE_LOG_LEVEL": "DEBUG",
        "SLUICE_HOME": str(tmp_path / "home"),
        "COLUMNS": "1000",  # one line per message (rich would wrap the URL)
    }
    upgrade = _cli(["db", "upgrade"], env, tmp_path)
    assert upgrade.returncode == 0, upgrade.stderr  # the password worked
    # (created, or already up to date: the server is shared by the cases)
    assert re.search(r"Schema sluice .*revision \d+\)? at postgresql", upgrade.stdout), upgrade
    assert "://alice:***@/" in upgrade.stdout
    status = _cli(["status", "--json"], env, tmp_path)
    assert status.returncode == 0, status.stderr
    assert "secret_pipe" in status.stdout
    for result in (upgrade, status):
        assert_hidden(result.stdout + result.stderr, form)
    # The same database with a wrong password: the one-line error hides the given one.
    server.use("changed")
    refused = _cli(["status", "--json"], env, tmp_path)
    assert refused.returncode == 2 and "password authentication failed" in refused.stderr
    assert_hidden(refused.stdout + refused.stderr, form)


# -- Spark -----------------------------------------------------------------------------------


def _landing(settings: Any, name: str, rows: int = 40) -> None:
    folder = settings.data_path / "landing" / name / "dt=2026-02-01"
    folder.mkdir(parents=True)
    lines = [orjson.dumps({"id": n, "v": f"r{n}"}) + b"\n" for n in range(rows)]
    (folder / "a.jsonl").write_bytes(b"".join(lines))


def _settings(url: str, tmp_path: Path) -> Any:
    return load_settings(
        database_url=url,
        home=tmp_path / "home",
        data_dir=tmp_path / "data",
        spark_master="local[2]",
        parallelism=1,
        checkpoint_interval_seconds=0.5,
        log_level="DEBUG",
    )


def _discover(settings: Any, pipeline: Pipeline) -> None:
    from enumerator_service._operations import discover, open_platform
    from spark_jobs.pipeline._paths import discovery_of

    platform = open_platform(settings)
    try:
        discover(platform, discovery_of(pipeline, settings))
    finally:
        platform.close()


@pytest.mark.spark
def test_a_spark_run_gets_the_password_on_the_executor_and_never_logs_it(
    server: PasswordServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    settings = _settings(_url(server, HARD), tmp_path)
    name = f"pw_{secrets.token_hex(3)}"
    pipeline = Pipeline(
        name=name,
        source=FileSource(schema={"id": "int64", "v": "string"}),
        sink=ParquetSink(name),
    )
    _landing(settings, name)
    _discover(settings, pipeline)
    summary = run_pipeline(settings, pipeline)
    # Every subtask connected (split store, checkpoints, sink) with the password it read.
    assert summary.rows_out == 40
    assert ds.dataset(output_path(pipeline, settings), partitioning="hive").count_rows() == 40
    assert_hidden(caplog.text, HARD)
    assert not list((settings.home_path / "secrets").iterdir())  # the run's file is gone


def _leak(url: str, password: str) -> Any:
    """A step that fails with the URL and the password in its message (as a careless library
    might)."""

    def fail(batch: pa.RecordBatch) -> pa.RecordBatch:
        raise RuntimeError(f"cannot reach {url} (password {password!r}, {password})")

    return fail


@pytest.mark.spark
def test_a_failed_task_comes_back_to_the_driver_without_the_password(
    server: PasswordServer,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG)
    url = _url(server, HARD)
    settings = _settings(url, tmp_path)
    name = f"pwfail_{secrets.token_hex(3)}"
    pipeline = Pipeline(
        name=name,
        source=FileSource(schema={"id": "int64", "v": "string"}),
        steps=[Map(_leak(url, str(HARD.password)), output={"w": "string"})],
        sink=ParquetSink(name),
    )
    _landing(settings, name, rows=5)
    _discover(settings, pipeline)
    with pytest.raises(Exception) as caught:  # noqa: PT011 - Spark's error type, any
        run_pipeline(settings, pipeline)
    text = str(caught.value)
    # A Map that raises is a deterministic error: the run stops with its one line (redacted
    # like the traceback a transient failure brings back).
    assert "step 1 (Map" in text and "cannot reach postgresql" in text
    assert_hidden(text, HARD)
    out, err = capfd.readouterr()
    assert_hidden(out + err + caplog.text, HARD)


# -- Dagster ---------------------------------------------------------------------------------


def _observe(url: str, home: Path) -> Any:
    asset = table_asset("public", "pg_secrets_probe", group="secrets", used_by="the test")
    sluice = SluiceResource(database=DatabaseResource(url=url))
    job = define_asset_job("observe", selection=AssetSelection.assets(asset))
    defs = Definitions(assets=[asset], jobs=[job], resources={"sluice": sluice})
    return defs.resolve_job_def("observe").execute_in_process(raise_on_error=False)


@pytest.mark.parametrize("name", ["all of them", "query password", "slash raw"])
def test_dagster_metadata_failures_and_tags_hide_the_password(
    server: PasswordServer, name: str, tmp_path: Path
) -> None:
    form = BY_NAME[name]
    url = _url(server, form)
    ok = _observe(url, tmp_path)
    assert ok.success
    server.use("changed")
    failed = _observe(url, tmp_path)
    assert not failed.success
    for result in (ok, failed):
        shown = repr(list(result.all_events)) + repr(result.dagster_run)
        assert_hidden(shown, form)
    failure = [e for e in failed.all_events if e.event_type_value == "STEP_FAILURE"]
    assert "password authentication failed" in repr(failure)
