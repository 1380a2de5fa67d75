"""Python workers are forked from Sluice's daemon, which imported the subtask's modules."""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spark_jobs._spark import spark_for

pytestmark = pytest.mark.spark


def test_workers_fork_from_the_daemon_that_preloaded_the_subtask_modules(
    make_settings: Any,
) -> None:
    def probe(_rows: Iterator[Any]) -> Iterator[tuple[str, bool, int]]:
        # (Nested: shipped by value, workers cannot import this test module.)
        parent = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().replace(b"\0", b" ")
        yield parent.decode(), "spark_jobs.jobs._subtask" in sys.modules, gc.get_freeze_count()

    spark = spark_for(make_settings())
    assert spark.sparkContext.getConf().get("spark.python.daemon.module") == "spark_jobs._daemon"
    found = spark.sparkContext.parallelize(range(2), 2).mapPartitions(probe).collect()
    assert len(found) == 2
    for parent, preloaded, frozen in found:
        # The worker's parent is the daemon process Spark started: python -m spark_jobs._daemon.
        assert "-m spark_jobs._daemon" in parent, parent
        assert preloaded
        # The imports are frozen (reader subtasks do not walk them in every collection).
        assert frozen > 50_000, frozen
