"""Error injection, files (issue 21, "files are immutable or detected"): during a continuous
run (local Spark, real Postgres) landing files are appended to, replaced and re-created after
they were registered, a file is written slowly, a file is moved in with a 2-hour-old mtime and
a quarantined CSV is fixed by its owner. Sluice never reads a file as a mix of two versions:
each changed file is refused (quarantined, reason "changed since discovery"); then ``sluice
retry --all-failed`` and ``sluice run`` (the CLI, exit codes checked) read every file as it is
at the end. Verdict against the independent oracle of the files at the end: duplicates=0,
missing=0, no unexpected row but the documented one (the committed output of a re-created
file's first version stays).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from conftest import TestSettings
from demo_platform import DICTIONARY, demo_pipeline, prepare_demo
from fault_harness import SLUICE, Expected, expected_events, log, verify

from enumerator_service import SplitStore
from enumerator_service._operations import Platform, discover, open_platform
from spark_jobs.pipeline._paths import discovery_of

pytestmark = [pytest.mark.faults, pytest.mark.spark, pytest.mark.timeout(600)]

MakeSettings = Callable[..., TestSettings]
DAY = "2026-01-01"
CSV_HEADER = "event_id,user_id,event_time,event_type,amount"
CHANGED = "changed since discovery"
BAD_HEADER = "bad CSV header"


def _events(prefix: str, n: int) -> list[dict[str, Any]]:
    return [
        {
            "event_id": f"{prefix}-{i}",
            "user_id": i % 50 + 1,
            "event_time": f"{DAY}T{i // 3600 % 24:02d}:{i // 60 % 60:02d}:{i % 60:02d}+00:00",
            "event_type": "click",
            "amount": 1.5,
        }
        for i in range(n)
    ]


def _jsonl(rows: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def _csv(rows: list[dict[str, Any]], header: str = CSV_HEADER) -> bytes:
    lines = [header] + [
        f"{r['event_id']},{r['user_id']},{r['event_time']},{r['event_type']},{r['amount']}"
        for r in rows
    ]
    return ("\n".join(lines) + "\n").encode()


def _keyed(rows: list[dict[str, Any]]) -> dict[str, tuple[Any, ...]]:
    """Events keyed like ``Expected.events``."""
    return {
        r["event_id"]: (
            DAY,
            r["user_id"],
            datetime.fromisoformat(r["event_time"]).astimezone(UTC),
            r["event_type"],
            float(r["amount"]),
        )
        for r in rows
    }


def _replace(path: Path, data: bytes) -> None:
    """An atomic replacement: written under a hidden name, renamed over ``path``."""
    staged = path.with_name(f".{path.name}.tmp")
    staged.write_bytes(data)
    os.replace(staged, path)


def _wait(condition: Callable[[], bool], timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.1)


class Landing:
    """The files of the case and what the feeder did, step by step, during the run."""

    def __init__(self, settings: TestSettings, platform: Platform, run_id: str) -> None:
        self.settings, self.platform, self.run_id = settings, platform, run_id
        self.folder = settings.landing_path / f"dt={DAY}"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.spec = discovery_of(demo_pipeline(settings), settings)
        self.store = SplitStore(platform.engine)
        self.first_version = _events("early1", 200)  # committed, then the file is re-created
        self.error: BaseException | None = None

    def path(self, name: str) -> Path:
        return self.folder / name

    def tick(self) -> None:
        """What the sensor does: discover, then give the new splits to the live run."""
        discover(self.platform, self.spec)
        self.store.assign_to_run(
            self.run_id, self.settings.source_name, lease_seconds=self.settings.lease_seconds
        )

    def before_the_run(self) -> None:
        self.path("stable.jsonl").write_bytes(_jsonl(_events("stable", 300)))
        self.path("early.jsonl").write_bytes(_jsonl(self.first_version))
        renamed = CSV_HEADER.replace("user_id", "uid")  # a poison file: quarantined
        self.path("orders.csv").write_bytes(_csv(_events("csv", 1), renamed))
        time.sleep(self.settings.file_settle_seconds + 0.2)  # quiet: registered whole
        assert discover(self.platform, self.spec).splits_registered == 3

    def during_the_run(self) -> None:
        try:
            self._feed()
        except BaseException as exc:  # shown by the main thread
            self.error = exc

    def _feed(self) -> None:
        source = self.settings.source_name
        _wait(lambda: self.store.counts(source).get("COMPLETED", 0) >= 2)
        log("files: first files read; re-creating early.jsonl, landing more")
        _replace(self.path("early.jsonl"), _jsonl(_events("early2", 250)))  # re-created
        self.path("replaced.jsonl").write_bytes(_jsonl(_events("old", 500)))
        self.path("appended.jsonl").write_bytes(_jsonl(_events("app", 600)[:300]))
        growing = _jsonl(_events("grow", 2000))
        self.path("growing.jsonl").write_bytes(growing[: len(growing) // 2])  # half a line
        time.sleep(self.settings.file_settle_seconds + 0.2)  # growing.jsonl pauses a while
        with self.path("growing.jsonl").open("ab") as file:
            file.write(growing[len(growing) // 2 : len(growing) // 2 + 100])  # still writing
        discover(self.platform, self.spec)  # registers replaced/appended, not growing
        # Between registration and read: one file replaced atomically, one appended to.
        _replace(self.path("replaced.jsonl"), _jsonl(_events("new", 800)))
        with self.path("appended.jsonl").open("ab") as file:
            file.write(_jsonl(_events("app", 600)[300:]))
        self.store.assign_to_run(self.run_id, source, lease_seconds=self.settings.lease_seconds)
        with self.path("growing.jsonl").open("ab") as file:  # the writer finishes
            file.write(growing[len(growing) // 2 + 100 :])
        moved = self.folder.parent / "moved.jsonl.outside"
        moved.write_bytes(_jsonl(_events("moved", 100)))
        old = time.time() - 7200
        os.utime(moved, (old, old))
        subprocess.run(["mv", str(moved), str(self.path("moved.jsonl"))], check=True)
        self.path("orders.csv").write_bytes(_csv(_events("csv", 4)))  # its owner fixes it
        time.sleep(self.settings.file_settle_seconds + 0.2)
        self.tick()
        log("files: feeder done")


def _quarantine_reasons(db_url: str, source: str) -> dict[str, set[str]]:
    """File name -> the reasons of its FAILED splits."""
    engine = sa.create_engine(sa.make_url(db_url).set(drivername="postgresql+psycopg"))
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT uri, failure_reason FROM sluice.splits"
                    " WHERE source = :s AND status = 'FAILED'"
                ),
                {"s": source},
            ).all()
    finally:
        engine.dispose()
    reasons: dict[str, set[str]] = {}
    for uri, reason in rows:
        reasons.setdefault(Path(uri).name, set()).add(str(reason))
    return reasons


def _pipelines_module(folder: Path, settings: TestSettings) -> None:
    """The test's pipeline for the ``sluice`` CLI (the same as ``demo_pipeline``)."""
    (folder / "files_pipelines.py").write_text(
        "import dataclasses\nfrom pathlib import Path\n"
        "from examples.clickstream import clickstream\nfrom spark_jobs import ParquetSink\n"
        f"NAME = {settings.source_name!r}\n"
        f"landing = Path({str(settings.landing_path)!r})\n"
        "source = dataclasses.replace(clickstream.source, landing=landing)\n"
        "pipeline = dataclasses.replace(clickstream, name=NAME, source=source, "
        f"sink=ParquetSink(f'enriched_{{NAME}}', dictionary={DICTIONARY!r}))\n"
    )


def _sluice(
    cwd: Path, settings: TestSettings, db_url: str, *args: str
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    env.update(
        SLUICE_DATABASE_URL=db_url,
        SLUICE_PIPELINES="files_pipelines",
        SLUICE_HOME=str(settings.home),
        SLUICE_DATA_DIR=str(settings.data_dir),
        SLUICE_SPARK_MASTER="local[2]",
        SLUICE_PARALLELISM="2",
        SLUICE_FILE_SETTLE_SECONDS="0.5",
        PYSPARK_PYTHON=sys.executable,
        COLUMNS="200",
    )
    done = subprocess.run(
        [str(SLUICE), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=300
    )
    log(f"sluice {' '.join(args)}: exit {done.returncode}\n{done.stdout[-2000:]}")
    return done


@pytest.fixture
def case(make_settings: MakeSettings) -> Iterator[tuple[TestSettings, Platform]]:
    settings = make_settings(
        demo_users=100,
        demo_days=1,
        checkpoint_interval_seconds=0.5,
        continuous_poll_seconds=0.2,
        continuous_idle_seconds=4,
        split_max_attempts=1,
        file_settle_seconds=0.5,
    )
    platform = open_platform(settings)
    try:
        prepare_demo(settings, platform, events=False)
        yield settings, platform
    finally:
        platform.close()


@pytest.mark.extended  # ~30 s: make faults, not CI (changing files in CI: test_changing_files.py)
def test_files_changing_during_a_continuous_run_are_refused_then_retried_exactly_once(
    case: tuple[TestSettings, Platform], tmp_path: Path
) -> None:
    from spark_jobs.jobs import run_pipeline

    settings, platform = case
    run_id = "run-files-continuous"
    landing = Landing(settings, platform, run_id)
    landing.before_the_run()
    feeder = threading.Thread(target=landing.during_the_run)
    feeder.start()
    try:
        run_pipeline(settings, demo_pipeline(settings), continuous=True, run_id=run_id)
    finally:
        feeder.join(timeout=300)
    assert landing.error is None, (landing.error, landing.store.counts(settings.source_name))
    db_url = platform.url
    source = settings.source_name
    # The documented refusal: every file that changed after its registration is quarantined
    # with the reason (never read as a mix); the slow writer and the moved file were read.
    refused = _quarantine_reasons(db_url, source)
    changed = ("early.jsonl", "replaced.jsonl", "appended.jsonl")
    expected_reasons = {name: {CHANGED} for name in changed}
    assert refused == {**expected_reasons, "orders.csv": {CHANGED, BAD_HEADER}}
    # The user's way out: retry re-reads each file as it is now; a run reads them whole.
    _pipelines_module(tmp_path, settings)
    retried = _sluice(tmp_path, settings, db_url, "retry", "--all-failed")
    assert retried.returncode == 0, retried.stderr
    # (An older version a run held while discovery registered the new one, or the appended
    # lines of a file, are lines of their own.)
    assert len(retried.stdout.strip().splitlines()) >= len(changed) + 1
    ran = _sluice(tmp_path, settings, db_url, "run", source)
    assert ran.returncode == 0, ran.stderr
    again = _sluice(tmp_path, settings, db_url, "discover", source)
    assert again.returncode == 0 and "0 new splits registered" in again.stdout
    # The oracle: what is in the files at the end (the JSON Lines files and the fixed CSV).
    oracle = expected_events(settings.landing_path)
    expected = Expected({**oracle.events, **_keyed(_events("csv", 4))}, oracle.malformed)
    verdict = verify(
        settings.output_path,
        db_url,
        source,
        expected,
        optional=_keyed(landing.first_version),  # committed before early.jsonl was re-created
    )
    log(verdict.line("files"))
    assert (verdict.duplicates, verdict.missing, verdict.unexpected) == (0, 0, 0)
    assert (verdict.wrong, verdict.malformed) == (0, 0)
    assert verdict.rows == len(expected.events) + len(landing.first_version)
    assert set(verdict.splits) <= {"COMPLETED", "SUPERSEDED"}
