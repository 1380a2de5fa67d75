"""Symbolic links in a landing folder: followed only inside it (unless SLUICE_FOLLOW_SYMLINKS).

A landing folder holding a link to a file outside it, a ``dt=`` link to a folder outside it,
a link loop, a dangling link, and links to a file and a folder inside it: discovery (real
Postgres) registers only the in-root data and counts the links it skipped; a run (real local
Spark) outputs exactly the in-root records; with the setting on, the outside links are
followed. A link swapped to the outside after discovery is refused when the reader opens it
(every format: JSON Lines, CSV and its header, gzip, Parquet).
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from conftest import TestSettings

from enumerator_service import FileSplit, LandingRoot, OutsideLandingError
from enumerator_service._landing import landing_days
from enumerator_service._operations import FileDiscovery, discover, open_platform
from spark_jobs import FileSource, ParquetSink, Pipeline
from spark_jobs.jobs import run_pipeline
from spark_jobs.source import RecordSchema
from spark_jobs.source._line_reader import LineSplitReader
from spark_jobs.source._parquet_reader import ParquetSplitError, ParquetSplitReader
from spark_jobs.source._records import SplitRead

DAY, OUT_DAY, IN_DAY = "dt=2026-01-01", "dt=2026-01-02", "dt=2026-01-03"


def _jsonl(path: Path, ids: range) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"id": i}) + "\n" for i in ids))


def _landing(tmp: Path, *, loops: bool = True) -> tuple[Path, dict[str, range]]:
    """A landing folder and, per kind of entry, the ids it holds (``loops``: with two link
    loops and a dangling link too)."""
    landing, outside = tmp / "landing", tmp / "outside"
    _jsonl(landing / DAY / "plain.jsonl", range(0, 10))
    _jsonl(outside / "secret.jsonl", range(100, 110))  # a link to a file outside
    (landing / DAY / "out_file.jsonl").symlink_to(outside / "secret.jsonl")
    _jsonl(outside / "day" / "x.jsonl", range(200, 210))  # a dt= link to a folder outside
    (landing / OUT_DAY).symlink_to(outside / "day")
    if loops:
        (landing / DAY / "loop.jsonl").symlink_to(landing / DAY / "loop.jsonl")
        (landing / DAY / "ping.jsonl").symlink_to(landing / DAY / "pong.jsonl")
        (landing / DAY / "pong.jsonl").symlink_to(landing / DAY / "ping.jsonl")
        (landing / DAY / "dangling.jsonl").symlink_to(tmp / "nowhere.jsonl")
    # Inside: a link to a file and a dt= link to a folder, both outside the listed folders.
    _jsonl(landing / "archive" / "kept.jsonl", range(300, 310))
    (landing / DAY / "in_file.jsonl").symlink_to(landing / "archive" / "kept.jsonl")
    _jsonl(landing / "archive_day" / "y.jsonl", range(400, 410))
    (landing / IN_DAY).symlink_to(landing / "archive_day")
    # A relative link leading out through "..".
    (landing / DAY / "dotdot.jsonl").symlink_to(Path("..") / ".." / "outside" / "secret.jsonl")
    ids = {
        "inside": range(0, 10),
        "in_file": range(300, 310),
        "in_dir": range(400, 410),
        "out_file": range(100, 110),
        "out_dir": range(200, 210),
    }
    return landing, ids


def _registered(platform: Any, source: str) -> set[str]:
    import sqlalchemy as sa

    from enumerator_service._schema import splits

    with platform.engine.connect() as conn:
        rows = conn.execute(sa.select(splits.c.uri).where(splits.c.source == source))
        return {os.path.relpath(uri, platform.settings.data_path) for uri in rows.scalars()}


@pytest.mark.parametrize("loops", [True, False])
@pytest.mark.parametrize("follow", [False, True])
@pytest.mark.parametrize("dates", [None, "all"])
def test_discovery_skips_links_out_of_the_landing_folder(
    make_settings: Any, follow: bool, dates: str | None, loops: bool
) -> None:
    settings: TestSettings = make_settings(follow_symlinks=follow)
    landing, _ = _landing(settings.data_path, loops=loops)
    platform = open_platform(settings)
    try:
        days = None if dates is None else [date_of(d) for d in (DAY, OUT_DAY, IN_DAY)]
        found = discover(platform, FileDiscovery(settings.source_name, landing), dates=days)
        registered = _registered(platform, settings.source_name)
    finally:
        platform.close()
    inside = {
        f"landing/{DAY}/plain.jsonl",
        f"landing/{DAY}/in_file.jsonl",
        f"landing/{IN_DAY}/y.jsonl",
    }
    outside = {
        f"landing/{DAY}/out_file.jsonl",
        f"landing/{DAY}/dotdot.jsonl",
        f"landing/{OUT_DAY}/x.jsonl",
    }
    broken = 4 if loops else 0  # loop, ping, pong, dangling: skipped whatever the setting
    if follow:
        assert registered == inside | outside
        assert found.skipped_links == broken
    else:
        assert registered == inside
        assert found.skipped_links == broken + 2 + 1  # two files out, one dt= folder out


@pytest.mark.parametrize("follow", [False, True])
def test_the_landing_days_are_the_dt_folders_discovery_would_read(
    tmp_path: Path, follow: bool
) -> None:
    """The days Dagster offers (``SLUICE_DAGSTER_PARTITIONS=discovered``) from a listing: a
    ``dt=`` folder counts when it holds a data file discovery would register — not when it is
    empty, holds only hidden or in-flight files, or is a link out of the folder (unless
    followed); a missing landing folder has none."""
    landing, _ = _landing(tmp_path)
    (landing / "dt=2026-01-04").mkdir()  # empty
    (landing / "dt=2026-01-05").mkdir()
    (landing / "dt=2026-01-05" / ".part-0.jsonl.tmp").write_text("{}\n")  # being written
    (landing / "dt=2026-01-05" / "_SUCCESS").write_text("")
    (landing / "dt=2026-01-05" / "notes.txt").write_text("not data")
    (landing / "dt=2026-1-6").mkdir()  # not a day
    _jsonl(landing / "dt=2026-1-6" / "a.jsonl", range(1))
    days = landing_days(landing, LandingRoot.of(landing, follow_symlinks=follow))
    expected = {DAY, IN_DAY} | ({OUT_DAY} if follow else set())
    assert days == {date_of(d) for d in expected}
    assert landing_days(tmp_path / "absent", LandingRoot.of(tmp_path / "absent")) == set()


def date_of(folder: str) -> Any:
    from datetime import date

    return date.fromisoformat(folder.removeprefix("dt="))


@pytest.mark.spark
def test_a_run_reads_only_the_data_inside_the_landing_folder(make_settings: Any) -> None:
    settings: TestSettings = make_settings()
    landing, ids = _landing(settings.data_path)
    pipeline = Pipeline(
        name=settings.source_name,
        source=FileSource(schema={"id": "int64"}, required=["id"], landing=landing),
        steps=[],
        sink=ParquetSink(),
    )
    platform = open_platform(settings)
    try:
        found = discover(platform, FileDiscovery(pipeline.name, landing))
    finally:
        platform.close()
    assert found.skipped_links == 7
    summary = run_pipeline(settings, pipeline)
    assert (summary.rows_out, summary.dead_letters) == (30, 0)
    rows = ds.dataset(settings.warehouse_path / pipeline.name, format="parquet").to_table()
    expected = [*ids["inside"], *ids["in_file"], *ids["in_dir"]]
    assert sorted(rows.column("id").to_pylist()) == sorted(expected)


# -- read time: a link swapped after discovery --------------------------------------------

SCHEMA = RecordSchema((pa.field("id", pa.int64()),), frozenset({"id"}))


def _write(path: Path, kind: str) -> None:
    rows = [{"id": 1}, {"id": 2}]
    if kind == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif kind == "csv":
        path.write_text("id\n1\n2\n")
    elif kind == "jsonl.gz":
        path.write_bytes(gzip.compress(b'{"id": 1}\n{"id": 2}\n'))
    else:
        pq.write_table(pa.Table.from_pylist(rows), path)


def _read(kind: str, path: Path, landing: LandingRoot) -> list[int]:
    reader: Any
    if kind == "parquet":
        reader = ParquetSplitReader(SCHEMA, landing=landing)
        split = FileSplit("s", kind, str(path), 0, None, None)
    else:
        reader = LineSplitReader(SCHEMA, max_line_bytes=1024, landing=landing)
        end = None if kind.endswith(".gz") else path.stat().st_size
        split = FileSplit("s", kind, str(path), 0, end, None)
    reader.open(SplitRead(1, split, 0))
    ids: list[int] = []
    try:
        while True:
            block, done = reader.fetch()
            if block is not None:
                ids += block.rows.column("id").to_pylist()
            if done:
                return ids
    finally:
        reader.close()


@pytest.mark.parametrize("kind", ["jsonl", "csv", "jsonl.gz", "parquet"])
def test_a_link_swapped_out_of_the_landing_folder_after_discovery_is_refused(
    tmp_path: Path, kind: str
) -> None:
    landing, outside = tmp_path / "landing", tmp_path / "outside"
    landing.mkdir()
    outside.mkdir()
    _write(landing / f"real.{kind}", kind)
    _write(outside / f"secret.{kind}", kind)
    link = landing / f"data.{kind}"
    link.symlink_to(landing / f"real.{kind}")  # what discovery saw: inside, allowed
    root = LandingRoot.of(landing)
    assert _read(kind, link, root) == [1, 2]
    link.unlink()
    link.symlink_to(outside / f"secret.{kind}")  # swapped after discovery
    expected = ParquetSplitError if kind == "parquet" else OutsideLandingError
    with pytest.raises(expected, match="outside the landing folder"):
        _read(kind, link, root)
    # With SLUICE_FOLLOW_SYMLINKS the outside target is read.
    assert _read(kind, link, LandingRoot.of(landing, follow_symlinks=True)) == [1, 2]


def test_a_file_swapped_while_it_is_opened_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The open file must be the file the resolved path names: a swap between the open and
    the check (simulated: the path resolves to another file inside) is refused."""
    (tmp_path / "a.jsonl").write_text("{}\n")
    (tmp_path / "b.jsonl").write_text("{}\n")
    root = LandingRoot.of(tmp_path)
    real = os.path.realpath
    monkeypatch.setattr(os.path, "realpath", lambda p, **k: real(str(p).replace("a.", "b.")))
    with pytest.raises(OutsideLandingError, match="changed while it was opened"):
        root.open(str(tmp_path / "a.jsonl"))
    monkeypatch.undo()
    with root.open(str(tmp_path / "a.jsonl")) as file:
        assert file.read() == b"{}\n"


def test_a_fifo_swapped_in_does_not_hang_the_open(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.jsonl")
    with pytest.raises(OSError, match="not a regular file"):
        LandingRoot.of(tmp_path).open(str(tmp_path / "pipe.jsonl"))


def test_parquet_is_read_from_the_checked_file_without_proc_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where there is no /proc/self/fd (macOS), Arrow reads the checked file object."""
    from spark_jobs.source import _parquet_reader

    monkeypatch.setattr(_parquet_reader, "_PROC_FD", tmp_path / "no-proc")
    _write(tmp_path / "a.parquet", "parquet")
    assert _read("parquet", tmp_path / "a.parquet", LandingRoot.of(tmp_path)) == [1, 2]
