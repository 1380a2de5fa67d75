"""File names that are not UTF-8 in a landing folder (real Postgres).

Linux file names are bytes; Python shows the undecodable ones with surrogate escapes, which no
Postgres text column accepts. Such a file is skipped with one warning naming it (escaped) and
counted in the discovery result; the good files next to it are registered.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from datetime import date
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from conftest import TestSettings

from enumerator_service._operations import FileDiscovery, discover, open_platform
from enumerator_service._schema import splits

SLUICE = str(Path(sys.executable).with_name("sluice"))
DAY = "dt=2026-01-01"
BAD = b"caf\xe9-latin1.jsonl"  # "café" in Latin-1: not UTF-8


def _registered(platform: Any, source: str) -> set[str]:
    with platform.engine.connect() as conn:
        rows = conn.execute(sa.select(splits.c.uri).where(splits.c.source == source))
        return {Path(uri).name for uri in rows.scalars()}


@pytest.mark.parametrize("dates", [None, [date(2026, 1, 1)]])
def test_a_file_name_that_is_not_utf8_is_skipped_with_a_warning(
    make_settings: Any, caplog: pytest.LogCaptureFixture, dates: list[date] | None
) -> None:
    settings: TestSettings = make_settings()
    landing = settings.data_path / "landing"
    (landing / DAY).mkdir(parents=True)
    for name in ("a.jsonl", "b.jsonl"):
        (landing / DAY / name).write_text(json.dumps({"id": 1}) + "\n")
    bad = os.path.join(os.fsencode(landing / DAY), BAD)
    with open(bad, "wb") as file:
        file.write(b'{"id": 2}\n')
    platform = open_platform(settings)
    try:
        with caplog.at_level(logging.WARNING):
            found = discover(platform, FileDiscovery(settings.source_name, landing), dates=dates)
        registered = _registered(platform, settings.source_name)
    finally:
        platform.close()
    assert registered == {"a.jsonl", "b.jsonl"}
    assert found.skipped_names == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("caf\\xe9-latin1.jsonl" in w and "UTF-8" in w for w in warnings), warnings


def test_sluice_discover_prints_the_skipped_name_and_counts_it(db_url: str, tmp_path: Path) -> None:
    landing = tmp_path / "landing"
    (landing / DAY).mkdir(parents=True)
    (landing / DAY / "good.jsonl").write_text('{"x": 1}\n')
    with open(os.path.join(os.fsencode(landing / DAY), BAD), "wb") as file:
        file.write(b'{"x": 2}\n')
    (tmp_path / "name_pipes.py").write_text(
        "from spark_jobs import FileSource, Pipeline\n"
        f'pipe = Pipeline(name="names_{os.getpid()}", '
        f'source=FileSource(landing="{landing}", schema={{"x": "int64"}}))\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    env |= {"SLUICE_PIPELINES": "name_pipes", "SLUICE_DATABASE_URL": db_url}
    result = subprocess.run(
        [SLUICE, "discover"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    out = " ".join(result.stdout.split())
    assert "1 new splits registered; 1 file(s) skipped: name not UTF-8" in out, out
    assert "caf\\xe9-latin1.jsonl has a name that is not UTF-8: skipped" in result.stderr
