"""Where the Spark driver listens: loopback for local masters, reachable for clusters."""

from __future__ import annotations

import socket

from spark_jobs._spark import _driver_addresses


def test_local_masters_stay_on_loopback() -> None:
    assert _driver_addresses("local[2]", None) == ("127.0.0.1", "127.0.0.1")
    assert _driver_addresses("local[*,4]", None) == ("127.0.0.1", "127.0.0.1")


def test_cluster_masters_bind_all_and_advertise_a_reachable_host() -> None:
    assert _driver_addresses("spark://spark-master:7077", None) == (
        socket.gethostname(),
        "0.0.0.0",  # noqa: S104 - asserting the bind address
    )
    assert _driver_addresses("spark://m:7077", "dagster-daemon") == ("dagster-daemon", "0.0.0.0")  # noqa: S104
