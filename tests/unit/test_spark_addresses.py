"""Where the Spark driver listens: loopback for local masters; with a cluster master, the
address it advertises to executors — never every interface — and the spark.authenticate
secret from exactly one of its two settings."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from enumerator_service import ConfigError, Settings
from spark_jobs._spark import _driver_addresses, auth_secret, spark_for


def test_local_masters_stay_on_loopback() -> None:
    assert _driver_addresses("local[2]", None) == ("127.0.0.1", "127.0.0.1")
    assert _driver_addresses("local[*,4]", None) == ("127.0.0.1", "127.0.0.1")


def test_cluster_masters_bind_the_address_they_advertise() -> None:
    host = socket.gethostname()
    assert _driver_addresses("spark://spark-master:7077", None) == (host, host)
    assert _driver_addresses("spark://m:7077", "dagster-daemon") == (
        "dagster-daemon",
        "dagster-daemon",
    )
    assert _driver_addresses("spark://127.0.0.1:7077", "10.1.2.3") == ("10.1.2.3", "10.1.2.3")


def test_the_auth_secret_comes_from_the_setting_or_its_file(tmp_path: Path) -> None:
    assert auth_secret(Settings()) is None
    assert auth_secret(Settings(spark_auth_secret="s3cret")) == "s3cret"
    path = tmp_path / "secret"
    path.write_text("from-file\n")
    assert auth_secret(Settings(spark_auth_secret_file=path)) == "from-file"


@pytest.mark.parametrize(
    ("settings", "setting", "problem"),
    [
        ({"spark_auth_secret": "s3cret", "spark_auth_secret_file": "f"}, "_FILE", "not both"),
        ({"spark_auth_secret_file": "missing"}, "_FILE", "No such file"),
        ({"spark_auth_secret_file": "empty"}, "_FILE", "is empty"),
        ({"spark_auth_secret_file": "binary"}, "_FILE", "not UTF-8"),
        ({"spark_auth_secret_file": "."}, "_FILE", "Is a directory"),
        ({"spark_auth_secret": "  "}, "SECRET", "must not be empty"),
    ],
)
def test_a_bad_auth_secret_fails_with_one_line_without_the_secret(
    tmp_path: Path, settings: dict[str, str], setting: str, problem: str
) -> None:
    (tmp_path / "f").write_text("s3cret")
    (tmp_path / "empty").write_text("\n")
    (tmp_path / "binary").write_bytes(b"\xff\xfe s3cret")
    values = {k: (tmp_path / v if k.endswith("_file") else v) for k, v in settings.items()}
    with pytest.raises(ConfigError) as caught:
        auth_secret(Settings(**values))  # type: ignore[arg-type]
    message = str(caught.value)
    assert caught.value.setting.endswith(setting) and problem in message
    assert "\n" not in message and "s3cret" not in message


def test_a_cluster_application_that_cannot_start_is_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Spark gives up registering with a master that refuses the secret (or is unreachable)
    after about 60 s with a NullPointerException; Sluice says what to check instead. (A real
    refused registration is too slow for the suite; tried by hand against the standalone
    cluster of ``tests/faults/spark_cluster.py``.)"""
    from pyspark.sql import SparkSession

    def refused(_self: object) -> None:
        raise RuntimeError("Cannot invoke TaskScheduler.postStartHook() ... is null")

    monkeypatch.setattr(SparkSession.Builder, "getOrCreate", refused)
    with pytest.raises(ConfigError) as caught:
        spark_for(Settings(spark_master="spark://127.0.0.1:1", spark_auth_secret="s3cret"))
    message = str(caught.value)
    assert caught.value.setting == "SLUICE_SPARK_MASTER"
    assert "spark://127.0.0.1:1" in message and "SLUICE_SPARK_AUTH_SECRET" in message
    assert "\n" not in message and "s3cret" not in message
