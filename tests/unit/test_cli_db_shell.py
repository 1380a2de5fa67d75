"""``sluice db shell -d NAME`` opens NAME on the platform's server: the ``-d``/``--dbname`` is
taken out of psql's arguments and NAME put in the URL psql connects to (psql read it as the
whole connection, on its default socket, and failed: the trial's ``sluice db shell -d shop``).
"""

from __future__ import annotations

import click
import pytest
from sqlalchemy.engine import make_url

from spark_jobs.cli._db import psql_target

SOCKET = "postgresql://postgres@/postgres?host=%2Ftmp%2Fsluice%2Fpg"
TCP = "postgresql://app@db.example:6543/platform?sslmode=require"


@pytest.mark.parametrize(
    ("args", "rest"),
    [
        (["-d", "shop"], []),
        (["-dshop"], []),
        (["--dbname", "shop"], []),
        (["--dbname=shop"], []),
        (["--db", "shop"], []),  # psql's getopt_long takes an unambiguous prefix
        (["-At", "-d", "shop", "-c", "select 1"], ["-At", "-c", "select 1"]),
        (["-Atd", "shop", "-c", "select 1"], ["-At", "-c", "select 1"]),
        (["-Atdshop"], ["-At"]),
        (["-d", "other", "--dbname=shop"], []),  # the last one wins, as in psql
        (["-c", "select 1", "-d", "shop"], ["-c", "select 1"]),
    ],
)
def test_a_dbname_option_names_the_database_on_the_same_server(
    args: list[str], rest: list[str]
) -> None:
    for url in (SOCKET, TCP):
        target, left = psql_target(url, args)
        before, after = make_url(url), make_url(target)
        assert after.database == "shop" and left == rest
        assert (after.host, after.port, after.username, after.query) == (
            before.host,
            before.port,
            before.username,
            before.query,
        )


def test_the_tcp_url_keeps_its_form() -> None:
    assert psql_target(TCP, ["-d", "shop"])[0] == (
        "postgresql://app@db.example:6543/shop?sslmode=require"
    )
    assert psql_target(SOCKET, ["-d", "shop"])[0] == (
        "postgresql://postgres@/shop?host=%2Ftmp%2Fsluice%2Fpg"
    )


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["-At", "-c", "select 1"],
        ["-c", "-d"],  # a value, not an option
        ["-cd"],  # -c with the value "d"
        ["-v", "x=1", "-f", "-dfile.sql"],
        ["--command", "-d x"],
        ["--set", "-d"],
        ["--", "-d", "shop"],  # after --: psql's operands
        ["postgres"],  # an operand is psql's to read
    ],
)
def test_arguments_without_a_dbname_option_go_to_psql_unchanged(args: list[str]) -> None:
    assert psql_target(SOCKET, args) == (SOCKET, args)


def test_a_name_is_percent_encoded_whole_and_reads_back_the_same() -> None:
    name = "my shop/1?#%@+é"
    target, _ = psql_target(SOCKET, ["-d", name])
    assert make_url(target).database == name
    assert target.startswith("postgresql://postgres@/my%20shop%2F1%3F%23%25%40%2B%C3%A9?host=")


@pytest.mark.parametrize(
    "args", [["-d"], ["-d", ""], ["--dbname"], ["--dbname="], ["--dbname", ""], ["-At", "-d"]]
)
def test_a_missing_or_empty_name_is_a_usage_error(args: list[str]) -> None:
    with pytest.raises(click.UsageError, match="needs a database name"):
        psql_target(SOCKET, args)


@pytest.mark.parametrize(
    "name",
    [
        "postgresql://elsewhere/shop",
        "postgres://u:hunter2@elsewhere/shop",
        "host=elsewhere password=hunter2",
    ],
)
def test_a_connection_string_is_refused_without_showing_it(name: str) -> None:
    with pytest.raises(click.UsageError, match="not a connection string") as raised:
        psql_target("postgresql://app@db.example/platform", ["-d", name])
    assert "hunter2" not in str(raised.value) and "elsewhere" not in str(raised.value)
