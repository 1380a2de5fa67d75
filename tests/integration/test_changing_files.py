"""Issue 21 rows 4-7 end to end on real Postgres and local Spark: a file appended to after
discovery, a file replaced between discover and run, a quarantined CSV fixed by its owner and
retried, files moved in with an old mtime. Each ends with every event of the files as they
are at the end in the output exactly once (or the documented refusal on the way)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest
from conftest import TestSettings
from demo_platform import demo_pipeline, demo_run, prepare_demo

from enumerator_service._operations import discover, open_platform
from enumerator_service._quarantine import quarantined, retry_splits
from spark_jobs.pipeline._paths import discovery_of

pytestmark = pytest.mark.spark

MakeSettings = Callable[..., TestSettings]
DAY = "2026-01-01"


def _events(prefix: str, n: int, start: int = 0) -> list[dict[str, Any]]:
    return [
        {
            "event_id": f"{prefix}-{i}",
            "user_id": i % 50 + 1,
            "event_time": f"{DAY}T{i // 3600 % 24:02d}:{i // 60 % 60:02d}:{i % 60:02d}+00:00",
            "event_type": "click",
            "amount": 1.5,
        }
        for i in range(start, start + n)
    ]


def _jsonl(rows: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def _ids(rows: list[dict[str, Any]]) -> Counter[str]:
    return Counter(str(r["event_id"]) for r in rows)


class Setup:
    """The test's platform, demo pipeline (users loaded, no landing files) and day folder."""

    def __init__(self, settings: TestSettings) -> None:
        self.settings = settings
        self.platform = open_platform(settings)
        prepare_demo(settings, self.platform, events=False)
        self.spec = discovery_of(demo_pipeline(settings), settings)
        self.folder = settings.landing_path / f"dt={DAY}"
        self.folder.mkdir(parents=True, exist_ok=True)

    def discover(self) -> int:
        return discover(self.platform, self.spec).splits_registered

    def run(self) -> Any:
        return demo_run(self.settings)

    def output(self) -> Counter[str]:
        if not self.settings.output_path.exists():
            return Counter()
        table = ds.dataset(self.settings.output_path, format="parquet").to_table(
            columns=["event_id"]
        )
        return Counter(str(i) for i in table.column("event_id").to_pylist())

    def quarantined(self) -> dict[str, tuple[str, str]]:
        found = quarantined(self.platform.engine, self.settings.source_name)
        return {Path(s.uri).name: (s.reason, s.last_error) for s in found}


@pytest.fixture
def setup(make_settings: MakeSettings) -> Iterator[Callable[..., Setup]]:
    made: list[Setup] = []

    def factory(**overrides: Any) -> Setup:
        base: dict[str, Any] = {"demo_users": 100, "demo_days": 1, "split_max_attempts": 1}
        made.append(Setup(make_settings(**{**base, **overrides})))
        return made[-1]

    yield factory
    for s in made:
        s.platform.close()


def test_row_4_a_file_still_being_written_is_read_whole_once_it_settled(
    setup: Callable[..., Setup],
) -> None:
    """Before: the split ended at the size seen at discovery; the half line was dead-lettered
    and 2,000 of 4,000 events were lost."""
    s = setup(file_settle_seconds=1.0)
    rows = _events("e", 4000)
    whole = _jsonl(rows)
    path = s.folder / "growing.jsonl"
    cut = len(_jsonl(rows[:2000])) + 20  # 2,000 lines and half of the next one
    path.write_bytes(whole[:cut])
    assert s.discover() == 0  # still being written: not registered
    assert s.run().nothing_new
    with path.open("ab") as file:  # the writer goes on and finishes
        file.write(whole[cut:])
    time.sleep(1.1)  # quiet for the settle time
    assert s.discover() == 1
    summary = s.run()
    assert summary.dead_letters == 0
    assert s.output() == _ids(rows)


def test_row_4_a_file_appended_to_after_registration_is_refused_then_retried_whole(
    setup: Callable[..., Setup],
) -> None:
    """A writer that paused longer than the settle time: registered, then grown. It is
    refused at read (never cut at the old size) and ``retry`` reads it whole."""
    s = setup()
    rows = _events("e", 3000)
    path = s.folder / "paused.jsonl"
    path.write_bytes(_jsonl(rows[:1000]))
    assert s.discover() == 1
    with path.open("ab") as file:
        file.write(_jsonl(rows[1000:]))
    s.run()
    ((reason, error),) = s.quarantined().values()
    assert reason == "changed since discovery" and "size " in error
    assert s.output() == Counter()
    assert len(retry_splits(s.platform.engine, None, source=s.settings.source_name)) == 1
    s.run()
    assert s.output() == _ids(rows)


def test_row_5_a_file_replaced_between_discover_and_run_is_never_read_as_a_mix(
    setup: Callable[..., Setup],
) -> None:
    """Before: 492 of 800 events read, a mix cut at the old size."""
    s = setup()
    path = s.folder / "replaced.jsonl"
    path.write_bytes(_jsonl(_events("old", 500)))
    assert s.discover() == 1
    new = _events("new", 800)
    staged = s.folder / ".replaced.jsonl.tmp"
    staged.write_bytes(_jsonl(new))
    os.replace(staged, path)  # an atomic replacement
    s.run()
    assert s.output() == Counter()  # refused: nothing of either version
    ((reason, error),) = s.quarantined().values()
    assert reason == "changed since discovery" and "replaced (another inode)" in error
    retry_splits(s.platform.engine, None, source=s.settings.source_name)
    s.run()
    assert s.output() == _ids(new)


def test_row_5_reprocess_reads_the_replaced_file_whole(setup: Callable[..., Setup]) -> None:
    s = setup(file_change_policy="reprocess")
    path = s.folder / "replaced.jsonl"
    path.write_bytes(_jsonl(_events("old", 500)))
    assert s.discover() == 1
    new = _events("new", 800)
    staged = s.folder / ".replaced.jsonl.tmp"
    staged.write_bytes(_jsonl(new))
    os.replace(staged, path)
    s.run()  # refused at read
    # reprocess: the next discovery registers the file as it is now.
    assert discover(s.platform, s.spec).changed_files == 1
    assert s.quarantined() == {}
    s.run()
    assert s.output() == _ids(new)


CSV_HEADER = "event_id,user_id,event_time,event_type,amount"


def _csv(rows: list[dict[str, Any]], header: str = CSV_HEADER) -> bytes:
    lines = [header] + [
        f"{r['event_id']},{r['user_id']},{r['event_time']},{r['event_type']},{r['amount']}"
        for r in rows
    ]
    return ("\n".join(lines) + "\n").encode()


def test_row_6_a_quarantined_csv_fixed_by_its_owner_is_retried_whole(
    setup: Callable[..., Setup], db_url: str
) -> None:
    """Before: retry resumed the old 61-byte range: 1 of its 4 rows reached the output,
    ``discover`` said 0 new splits, exit 0."""
    s = setup()
    rows = _events("c", 4)
    path = s.folder / "orders.csv"
    path.write_bytes(_csv(rows[:1], CSV_HEADER.replace("user_id", "uid")))
    assert s.discover() == 1
    s.run()
    assert s.quarantined()["orders.csv"][0] == "bad CSV header"
    path.write_bytes(_csv(rows))  # the owner fixes it: all four rows
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    env.update(SLUICE_DATABASE_URL=db_url, SLUICE_PIPELINES="examples.clickstream")
    sluice = shutil.which("sluice", path=str(Path(os.sys.executable).parent))
    assert sluice is not None
    retried = subprocess.run(
        [sluice, "retry", "--all-failed"], env=env, capture_output=True, text=True, timeout=60
    )
    assert retried.returncode == 0, retried.stderr
    s.run()
    assert s.output() == _ids(rows)
    assert s.quarantined() == {}


def test_row_7_files_moved_in_with_an_old_mtime_are_discovered_and_read(
    setup: Callable[..., Setup], tmp_path: Path
) -> None:
    """Before: never discovered by ``sluice discover`` or the sensor; only with --date."""
    s = setup()
    first = _events("first", 100)
    (s.folder / "first.jsonl").write_bytes(_jsonl(first))
    assert s.discover() == 1
    outside = tmp_path / "outside"
    outside.mkdir()
    moved: list[dict[str, Any]] = []
    for how in ("mv", "cp -p", "rsync -a"):
        name = how.replace(" ", "").replace("-", "_") + ".jsonl"
        rows = _events(name.removesuffix(".jsonl"), 50)
        moved.extend(rows)
        made = outside / name
        made.write_bytes(_jsonl(rows))
        old = time.time() - 7200
        os.utime(made, (old, old))
        if how == "mv":
            subprocess.run(["mv", str(made), str(s.folder / name)], check=True)
        elif how == "cp -p":
            subprocess.run(["cp", "-p", str(made), str(s.folder / name)], check=True)
        else:  # rsync -a: a hidden temporary file keeping the mtime, renamed into place
            temporary = s.folder / f".{name}.Xa1b2"
            shutil.copy2(made, temporary)
            os.rename(temporary, s.folder / name)
    assert s.discover() == 3
    s.run()
    assert s.output() == _ids(first + moved)
