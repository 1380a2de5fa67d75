"""Passwords never shown, never shipped: the one URL redaction over every URL form, the reprs
of config-carrying objects, and a task closure (pickled as Spark does) without the password.

The URL forms (``FORMS``) are shared with the integration matrix in
``tests/integration/test_secret_surfaces.py``.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import sqlalchemy as sa
from pyspark import cloudpickle
from url_forms import FORMS, SOCKET, Form, assert_hidden, forms_of

from dagster_project.resources import DatabaseResource, SluiceResource
from enumerator_service import ConfigError, database_url, load_settings, redact_text, redact_url
from enumerator_service._operations import Platform
from spark_jobs import FileSource, Pipeline
from spark_jobs.jobs._credentials import WorkerDatabase, share_database
from spark_jobs.jobs._task_config import TaskConfig
from spark_jobs.pipeline import SampleTarget


@pytest.mark.parametrize("form", FORMS, ids=[f.name for f in FORMS])
@pytest.mark.parametrize("at", ["db.example:5432/app", SOCKET], ids=["tcp", "socket"])
def test_redact_url_hides_every_form_and_keeps_the_rest(form: Form, at: str) -> None:
    url = form.url(at)
    shown = redact_url(url)
    assert_hidden(shown, form)
    assert "alice" in shown or "alice" not in url
    assert "db.example" in shown or "%2Fvar%2Frun%2Fpostgresql" in shown
    if form.password is not None:
        assert "***" in shown
    else:
        assert shown == url.replace("/var/run/postgresql", "%2Fvar%2Frun%2Fpostgresql")


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://alice:pa@ss/word@db.example/app",  # a raw @: the parser is misled
        "postgresql://alice:s3cret@db.example:notaport/app",  # unparsable port
        "postgresql://alice:s3cret@db.example/app?password=x&password=y",
    ],
)
def test_an_unreadable_url_fails_closed(url: str) -> None:
    shown = redact_url(url)
    assert "s3cret" not in shown and "pa@ss" not in shown and "ss/word" not in shown
    assert shown.startswith("postgresql://")


def test_libpq_key_value_strings_and_other_text() -> None:
    assert redact_url("host=h user=u password='x y' dbname=d") == (
        "host=h user=u password=*** dbname=d"
    )
    assert redact_url("host=h password=s3cret") == "host=h password=***"
    assert redact_url("not a url: s3cret") == "***"


def test_redact_text_finds_the_password_in_any_encoding_and_any_url() -> None:
    url = "postgresql://alice:a%2Fb%40c@db/app"
    text = f"failed: a/b@c, a%2Fb%40c, a%2fb%40c, a%2Fb@c and postgresql://bob:other@x/y {url}"
    shown = redact_text(text, url)
    for leaked in ("a/b@c", "a%2Fb%40c", "a%2fb%40c", "other"):
        assert leaked not in shown
    assert "postgresql://bob:***@x/y" in shown
    assert redact_text("cannot connect to postgresql://u:pw@h/db: refused") == (
        "cannot connect to postgresql://u:***@h/db: refused"
    )


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("postgresql://alice:pa@ss@db/app", "percent-encode"),
        ("postgresql://alice:s3cret@db:notaport/app", "cannot parse"),
        ("mysql://alice:s3cret@db/app", "postgresql://"),
        ("postgresql://alice:s3cret@db/app?sslpassword=s3cret", "sslpassword cannot"),
    ],
)
def test_a_bad_url_is_one_line_without_the_password(url: str, problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(database_url=url)
    message = str(caught.value)
    assert message.startswith("SLUICE_DATABASE_URL: ") and problem in message
    assert "s3cret" not in message and "pa@ss" not in message and "\n" not in message


def test_the_password_comes_from_one_place(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("fr/om@file\n")
    bare = "postgresql://alice@db/app"
    assert database_url(load_settings(database_url=bare, database_password_file=secret)) == (
        "postgresql://alice:fr%2Fom%40file@db/app"
    )
    assert database_url(load_settings(database_url=bare, database_password="en:v")) == (
        "postgresql://alice:en%3Av@db/app"
    )
    # ?password= moves into the URL, where every renderer (Engine's repr too) hides it.
    moved = database_url(load_settings(database_url=f"{bare}?password=q%2Fp&sslmode=require"))
    assert moved == "postgresql://alice:q%2Fp@db/app?sslmode=require"
    assert "q%2Fp" not in repr(sa.create_engine(moved.replace("postgresql", "postgresql+psycopg")))
    for given in ({"database_password": "x"}, {"database_password_file": secret}):
        with pytest.raises(ConfigError, match="given twice"):
            database_url(load_settings(database_url="postgresql://alice:y@db/app", **given))
    with pytest.raises(ConfigError, match="SLUICE_DATABASE_PASSWORD_FILE: cannot read"):
        database_url(load_settings(database_url=bare, database_password_file=tmp_path / "no"))


# -- reprs ---------------------------------------------------------------------------------

SECRET_URL = "postgresql://alice:Tr%2Fcky%40pw%3Aü@db.example/app?sslmode=require"
SECRET_FORMS = forms_of("Tr/cky@pw:ü")


def _clean(text: str) -> None:
    for leaked in SECRET_FORMS:
        assert leaked not in text, f"{leaked!r} in {text!r}"


def _pipeline() -> Pipeline:
    return Pipeline(name="secrets_demo", source=FileSource(schema={"id": "int64"}))


def _task_config(database: WorkerDatabase) -> TaskConfig:
    pipeline = _pipeline()
    return TaskConfig(
        pipeline=pipeline,
        plan=pipeline.plan,
        lookup_types={},
        database=database,
        run_id="run-1",
        lease_seconds=60.0,
        output_root="/tmp/out",  # noqa: S108 - never written
        staging_root="/tmp/staging",  # noqa: S108 - never written
        max_line_bytes=1024,
    )


def test_reprs_of_config_carrying_objects_hide_the_password(tmp_path: Path) -> None:
    settings = load_settings(database_url=SECRET_URL, home=tmp_path, spark_master="local[2]")
    url = database_url(settings)
    engine = sa.create_engine(url.replace("postgresql", "postgresql+psycopg", 1))
    platform = Platform(settings, url, engine)
    database, unshare = share_database(settings, url)
    try:
        resource = SluiceResource(database=DatabaseResource(url=SECRET_URL))
        target = SampleTarget(settings, tmp_path, url)
        for shown in (platform, settings, database, _task_config(database), resource, target):
            _clean(repr(shown))
            _clean(str(shown))
        _clean(repr(resource.database))
        assert "alice" in repr(platform) and "alice" in repr(resource)
    finally:
        unshare()
        engine.dispose()


@pytest.mark.parametrize("master", ["local[2]", "spark://master:7077"])
def test_a_pickled_task_closure_holds_no_password(tmp_path: Path, master: str) -> None:
    settings = load_settings(database_url=SECRET_URL, home=tmp_path, spark_master=master)
    url = database_url(settings)
    database, unshare = share_database(settings, url)
    try:
        closure = cloudpickle.dumps(_task_config(database))
        for leaked in SECRET_FORMS:
            assert leaked.encode() not in closure, leaked
            assert leaked.encode("utf-16-le") not in closure, leaked
        assert b"alice" in closure and b"db.example" in closure
        # What the closure carries still reaches the database with the password.
        config = cloudpickle.loads(closure)
        if master.startswith("local"):
            assert config.database_url == url
            path = Path(config.database.password_file)
            assert stat.S_IMODE(path.stat().st_mode) == 0o600
            assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        else:
            assert config.database.password_file is None
    finally:
        unshare()
    if master.startswith("local"):
        assert not path.exists()  # the run's password file is gone with the run


def test_executors_read_the_password_from_their_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in (
        "SLUICE_DATABASE_PASSWORD",
        "SLUICE_DATABASE_PASSWORD_FILE",
        "SLUICE_DATABASE_URL",
    ):
        monkeypatch.delenv(name, raising=False)
    database = WorkerDatabase("postgresql://alice@db/app", needs_password=True)
    with pytest.raises(ConfigError) as caught:
        database.resolve()
    assert str(caught.value).startswith("SLUICE_DATABASE_PASSWORD: ")
    monkeypatch.setenv("SLUICE_DATABASE_URL", "postgresql://alice:fr%2Fom-url@db/app")
    assert database.resolve() == "postgresql://alice:fr%2Fom-url@db/app"
    (tmp_path / "pw").write_text("fr/om-file\n")
    monkeypatch.setenv("SLUICE_DATABASE_PASSWORD_FILE", str(tmp_path / "pw"))
    assert database.resolve() == "postgresql://alice:fr%2Fom-file@db/app"
    monkeypatch.setenv("SLUICE_DATABASE_PASSWORD", "fr/om-env")
    assert database.resolve() == "postgresql://alice:fr%2Fom-env@db/app"
    assert os.environ["SLUICE_DATABASE_PASSWORD"] == "fr/om-env"


def test_an_unwritable_home_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "home").write_text("a file, not a folder")
    settings = load_settings(
        database_url=SECRET_URL, home=tmp_path / "home", spark_master="local[2]"
    )
    with pytest.raises(ConfigError) as caught:
        share_database(settings, database_url(settings))
    assert str(caught.value).startswith("SLUICE_HOME: cannot write ")
    _clean(str(caught.value))
