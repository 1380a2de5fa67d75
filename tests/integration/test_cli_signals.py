"""A ``sluice run`` stopped by SIGTERM (``kill``, a container stop) ends like Ctrl-C: one
line, exit 143, and what it did not commit goes back to the pool at once — the next run
reads it, not "held by another live run" until the lease ends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from cli_env import module_env

SLUICE = str(Path(sys.executable).with_name("sluice"))

#: A slow Map (0.3 s a batch) that says when it first ran (the run is reading then).
SLOW = """
import pathlib, time
from spark_jobs import FileSource, Map, Pipeline

def slow(batch):
    if batch.num_rows:
        pathlib.Path({started!r}).touch()
        time.sleep(0.3)
    return batch

slow_run = Pipeline(
    name={name!r},
    source=FileSource(landing={landing!r}, schema={{"x": "int64"}}, partition_by=None),
    steps=[Map(slow)],
)
"""


def _env(db_url: str, cwd: Path) -> dict[str, str]:
    # Waiting out a lease would fail the test's timing.
    return module_env(db_url, cwd, "signal_pipelines", SLUICE_LEASE_SECONDS="600")


@pytest.mark.spark
@pytest.mark.parametrize(
    ("signum", "code", "last_line"),
    [
        # `kill PID` (a supervisor, `timeout`): the sluice process alone.
        (signal.SIGTERM, 143, "Terminated."),
        # Ctrl-C in a terminal: the whole foreground process group, Spark's JVM included
        # (PySpark's own SIGINT handler called Py4J inside the handler: "reentrant call").
        (signal.SIGINT, 130, "Aborted."),
    ],
    ids=["sigterm", "ctrl-c"],
)
def test_a_signal_stops_a_run_in_one_line_and_gives_its_splits_back(
    db_url: str, tmp_path: Path, signum: int, code: int, last_line: str
) -> None:
    name = f"slow_run_{signum}"  # the database is the session's: a source per case
    landing, started = tmp_path / "landing", tmp_path / "started"
    landing.mkdir()
    for n in range(12):  # 12 files of 50 records: ~12 slow batches
        (landing / f"f{n:02d}.jsonl").write_text(
            "".join(json.dumps({"x": n * 50 + i}) + "\n" for i in range(50))
        )
    (tmp_path / "signal_pipelines.py").write_text(
        SLOW.format(landing=str(landing), started=str(started), name=name)
    )
    env = _env(db_url, tmp_path)
    run = lambda *args: subprocess.run(  # noqa: E731
        [SLUICE, *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert run("discover", name).returncode == 0
    process = subprocess.Popen(
        [SLUICE, "run", name], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while not started.exists():
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the run never started reading"
            time.sleep(0.1)
        if signum == signal.SIGINT:
            os.killpg(process.pid, signum)
        else:
            process.send_signal(signum)
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == code, (process.returncode, out, err[-3000:])
    assert err.strip().splitlines()[-1] == last_line, err[-2000:]
    # No page of Py4J traceback about the call the signal cut short, or a broken pipe.
    assert "Traceback" not in err and "while sending command" not in err, err[-3000:]
    # Given back at once (before: leased to the dead run until its lease ended, and the next
    # run exited 4, "held by another live run"): nothing assigned, reading or leased.
    engine = sa.create_engine(sa.make_url(db_url).set(drivername="postgresql+psycopg"))
    try:
        with engine.connect() as conn:
            held = conn.execute(
                sa.text(
                    "SELECT count(*) FROM sluice.splits WHERE source = :s "
                    "AND (status NOT IN ('UNASSIGNED', 'COMPLETED') OR run_id IS NOT NULL "
                    "AND status <> 'COMPLETED')"
                ),
                {"s": name},
            ).scalar_one()
            total = conn.execute(
                sa.text("SELECT count(*) FROM sluice.splits WHERE source = :s"), {"s": name}
            ).scalar_one()
    finally:
        engine.dispose()
    assert (held, total) == (0, 12)
