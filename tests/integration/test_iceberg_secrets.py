"""The platform database's password never surfaces through the Iceberg sink: Sluice's
catalog lives in a private Postgres that checks passwords (``secret_postgres``) and the
password has every special character (``url_forms``); a real run at DEBUG logs commits, and
neither the logs, the catalog's repr and properties, the sink's descriptions nor its pickled
connector (what travels to Spark tasks) show the password."""

from __future__ import annotations

import logging
import pickle
import secrets
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from secret_postgres import PasswordServer, password_server
from url_forms import FORMS, assert_hidden

from enumerator_service import connect_engine, database_url, load_settings
from enumerator_service._operations import discover, open_platform
from spark_jobs import FileSource, IcebergSink, Pipeline
from spark_jobs.connectors import sink_connector_named
from spark_jobs.connectors.iceberg._catalog import open_catalog
from spark_jobs.jobs import run_pipeline
from spark_jobs.pipeline._paths import discovery_of

pytestmark = pytest.mark.spark

HARD = {form.name: form for form in FORMS}["all of them"]


@pytest.fixture(scope="module")
def server() -> Iterator[PasswordServer]:
    with password_server() as private:
        yield private


def test_the_catalog_password_is_in_no_log_repr_description_or_task_closure(
    server: PasswordServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    assert HARD.password is not None
    server.use(HARD.password)
    settings = load_settings(
        database_url=HARD.url(server.at()),
        home=tmp_path / "home",
        data_dir=tmp_path / "data",
        spark_master="local[2]",
        parallelism=1,
        checkpoint_interval_seconds=0.5,
        log_level="DEBUG",
    )
    name = f"pw_{secrets.token_hex(3)}"
    pipeline = Pipeline(
        name=name,
        source=FileSource(
            schema={"id": "int64", "v": "string"}, required=["id"], partition_by=None
        ),
        sink=IcebergSink(f"{name}.rows"),
    )
    folder = settings.data_path / "landing" / name
    folder.mkdir(parents=True)
    lines = [orjson.dumps({"id": n, "v": f"r{n}"}) + b"\n" for n in range(40)]
    (folder / "a.jsonl").write_bytes(b"".join(lines))
    platform = open_platform(settings)
    try:
        discover(platform, discovery_of(pipeline, settings))
    finally:
        platform.close()

    summary = run_pipeline(settings, pipeline)

    assert summary.rows_out == 40
    engine = connect_engine(database_url(settings, create=False), pool_size=1)
    try:
        catalog = open_catalog(engine, None, None)
        table = catalog.load_table(f"{name}.rows")
        assert table.scan().to_arrow().num_rows == 40
        connector = sink_connector_named("iceberg")
        shown = [
            caplog.text,
            repr(catalog),
            repr(catalog.properties),
            repr(table.io.properties),
            connector.describe(pipeline.plan),
            connector.location(pipeline, settings, []),
            repr(pickle.dumps(connector)),
        ]
        # The password as SQLAlchemy renders it in a URL (its own escaping).
        rendered = engine.url.render_as_string(hide_password=False)
        as_in_urls = rendered.split("://", 1)[1].rsplit("@", 1)[0].split(":", 1)[1]
    finally:
        engine.dispose()
    assert len(as_in_urls) >= len(HARD.password)
    for text in shown:
        assert_hidden(text, HARD)
        assert as_in_urls not in text
