"""The run tells the truth (issue 21): a deterministic error in the pipeline's code stops the
run at once with one line and exit code 5; the summary and exit code name quarantined and
held input; "Nothing new" only when nothing is new. Real Postgres, real Spark (through the
``sluice`` command, as a user sees it)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

SLUICE = str(Path(sys.executable).with_name("sluice"))

#: A user's module: a Map that returns a string where it declared a double (for x == 37),
#: and records every batch holding that record (one line per attempt that reached it).
BAD_MAP = """
import pyarrow as pa
import pyarrow.compute as pc
from spark_jobs import FileSource, Map, Pipeline

def score(batch):
    if 37 in batch.column("x").to_pylist():
        with open({attempts!r}, "a") as f:
            f.write("attempt\\n")
    text = pc.cast(batch.column("x"), pa.string())
    return batch.append_column("score", pc.if_else(pc.equal(batch.column("x"), 37), "n/a", text))

bad_map = Pipeline(
    name="bad_map",
    source=FileSource(landing={landing!r}, schema={{"x": "int64"}}, partition_by=None),
    steps=[Map(score, output={{"score": "double"}})],
)
"""


def _sluice(
    args: list[str], db_url: str, cwd: Path, **env: str
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    clean.update(
        SLUICE_DATABASE_URL=db_url,
        SLUICE_PIPELINES="truth_pipelines",
        SLUICE_HOME=str(cwd / "home"),
        SLUICE_SPARK_MASTER="local[2]",
        SLUICE_PARALLELISM="2",
        COLUMNS="400",  # rich: one table row per line
        PYTHONPATH=os.pathsep.join([str(cwd), os.environ.get("PYTHONPATH", "")]),
        **env,
    )
    return subprocess.run(
        [SLUICE, *args], env=clean, cwd=cwd, capture_output=True, text=True, timeout=300
    )


def _land(folder: Path, name: str, values: range) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text("".join(json.dumps({"x": x}) + "\n" for x in values))


@pytest.mark.spark
def test_a_map_returning_the_wrong_type_stops_the_run_at_once_with_one_line(
    db_url: str, tmp_path: Path
) -> None:
    landing, attempts = tmp_path / "landing", tmp_path / "attempts.txt"
    _land(landing, "a.jsonl", range(100))  # holds x == 37, at line 38
    _land(landing, "b.jsonl", range(100, 200))
    (tmp_path / "truth_pipelines.py").write_text(
        BAD_MAP.format(landing=str(landing), attempts=str(attempts))
    )
    assert _sluice(["discover", "bad_map"], db_url, tmp_path).returncode == 0
    started = time.monotonic()
    run = _sluice(["run", "bad_map"], db_url, tmp_path)
    seconds = time.monotonic() - started
    # Before: exit 1 after 4 stage attempts and 468 lines of Py4J/Python traceback (44 s).
    assert run.returncode == 5, run.stderr[-3000:]
    assert attempts.read_text().count("attempt") == 1  # one stage attempt, no retries
    assert "Traceback" not in run.stderr and "Py4J" not in run.stderr
    ours = [line for line in run.stderr.splitlines() if line.startswith("sluice")]
    # (Spark's JVM prints its three banner lines first: "Setting default log level", …)
    assert len(run.stderr.strip().splitlines()) <= 4, run.stderr
    (line,) = ours
    assert re.fullmatch(
        r"sluice: run failed: pipeline bad_map: step 1 \(Map score\): field 'score': is "
        r"string, not double \(value 'n/a'\): Failed to parse string: 'n/a' as a scalar of "
        rf"type double \(record: split \d+ \({re.escape(str(landing / 'a.jsonl'))}\) "
        r"offset 360\)",
        line,
    ), line
    print(f"deterministic error: exit {run.returncode} after {seconds:.1f} s, 1 attempt")
    # Nothing was committed past it: both splits are back in the pool for the fixed code.
    status = _sluice(["status", "bad_map", "--json"], db_url, tmp_path)
    splits = json.loads(status.stdout)["pipelines"]["bad_map"]["splits"]
    assert splits["UNASSIGNED"] >= 1 and splits["UNASSIGNED"] + splits["COMPLETED"] == 2
