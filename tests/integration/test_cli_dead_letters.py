"""``sluice dead-letters`` after a real run (real Postgres, local Spark): counts per day and
reason, each record's place and exact bytes against the lines written, the filters, and raw
input that would drive a terminal (escape sequences, markup, bytes that are not UTF-8)
shown escaped."""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from cli_env import run_sluice

MODULE = """
from spark_jobs import FileSource, Pipeline

events = Pipeline(
    name="dl_events",
    source=FileSource(landing="{landing}", schema={{"x": "int64", "name": "string"}}),
)
"""

#: (day, lines): the good lines and the bad ones, with their reason's category.
DAYS: dict[str, list[tuple[bytes, str | None]]] = {
    "2026-03-01": [
        (b'{"x": 1, "name": "a"}', None),
        (b"this is not json", "invalid JSON"),
        (b'{"x": 2, "name": "b"}', None),
        # (a raw control character is not valid in a JSON string)
        (b'{"x": "\x1b[31m[bold]red", "name": "c"}', "invalid JSON"),
        (b'{"x": "seven", "name": "h"}', "wrong type"),
        (b'{"x": 3, "name": "d"}', None),
    ],
    "2026-03-02": [
        (b'{"x": 4, "name": "e"}', None),
        (b'\xff\xfe{"x": 5, "name": "f"}', "invalid UTF-8"),
        (b'{"x": 6, "name": "g"', "invalid JSON"),
    ],
}


def _sluice(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_sluice(args, env, cwd, timeout=180)


def _json(args: list[str], env: dict[str, str], cwd: Path) -> dict[str, Any]:
    done = _sluice(["dead-letters", "dl_events", "--json", *args], env, cwd)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


@pytest.fixture(scope="module")
def ran(db_url: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, str], Path, Any]:
    """The landing written, the pipeline run once; the oracle: (uri, offset) -> (day, line,
    category) of every bad line."""
    root = tmp_path_factory.mktemp("dead_letters_cli")
    landing = root / "landing"
    oracle: dict[tuple[str, int], tuple[str, bytes, str]] = {}
    for day, lines in DAYS.items():
        folder = landing / f"dt={day}"
        folder.mkdir(parents=True)
        path = folder / "part-0.jsonl"
        path.write_bytes(b"".join(line + b"\n" for line, _ in lines))
        offset = 0
        for line, category in lines:
            if category is not None:
                oracle[str(path), offset] = (day, line, category)
            offset += len(line) + 1
    (root / "dl_pipelines.py").write_text(MODULE.format(landing=landing))
    env = {
        "SLUICE_PIPELINES": "dl_pipelines",
        "SLUICE_DATABASE_URL": db_url,
        "SLUICE_HOME": str(root / "home"),
    }
    for command in ("discover", "run"):
        done = _sluice([command, "dl_events"], env, root)
        assert done.returncode == 0, done.stderr
    return env, root, oracle


def test_every_dead_letter_is_listed_on_its_day_with_its_exact_bytes(ran: Any) -> None:
    env, root, oracle = ran
    listing = _json([], env, root)
    assert listing["total"] == len(oracle) == 5
    expected: dict[tuple[str, str], int] = {}
    for day, _, category in oracle.values():
        expected[day, category] = expected.get((day, category), 0) + 1
    assert {(r["day"], r["reason"]): r["count"] for r in listing["by_day"]} == expected
    assert [r["day"] for r in listing["by_day"]] == sorted(r["day"] for r in listing["by_day"])
    seen = {
        (letter["uri"], letter["offset"]): (
            letter["day"],
            base64.b64decode(letter["raw_base64"]),
            letter["reason"].split(":", 1)[0],
        )
        for letter in listing["dead_letters"]
    }
    assert seen == oracle


def test_the_filters_pick_days_reasons_and_how_many(ran: Any) -> None:
    env, root, _ = ran
    second = _json(["--date", "2026-03-02"], env, root)
    assert second["total"] == 2
    assert {letter["day"] for letter in second["dead_letters"]} == {"2026-03-02"}
    utf8 = _json(["--reason", "utf-8"], env, root)  # (any case: "invalid UTF-8")
    assert [letter["reason"].split(":")[0] for letter in utf8["dead_letters"]] == ["invalid UTF-8"]
    # A LIKE wildcard in --reason is taken literally: no reason holds a '%'.
    assert _json(["--reason", "%"], env, root)["total"] == 0
    first = _json(["--limit", "1"], env, root)
    assert first["total"] == 5 and len(first["dead_letters"]) == 1 and first["truncated"]
    assert first["dead_letters"][0]["day"] == "2026-03-01"
    every = _json([], env, root)  # (--json shows every one unless --limit)
    assert len(every["dead_letters"]) == 5 and not every["truncated"]
    none = _sluice(["dead-letters", "dl_events", "--date", "2026-03-09"], env, root)
    assert none.returncode == 0 and none.stdout.strip() == "no dead letters of dl_events match"


def test_the_table_escapes_raw_input_and_says_what_it_left_out(ran: Any) -> None:
    env, root, _ = ran
    shown = _sluice(["dead-letters", "dl_events", "--limit", "3"], env, root)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert "Dead letters of dl_events: 5" in out
    assert "\x1b" not in out  # the escape sequence of a line never reaches the terminal
    wide = _sluice(["dead-letters", "dl_events", "--date", "2026-03-01"], env, root)
    flat = "".join(wide.stdout.split())  # (rich folds long cells over lines)
    assert "\\x1b[31m[bold]red" in flat  # escaped, and not taken as markup
    assert "showing 3 of 5" in out
    bad = _sluice(["dead-letters", "dl_events", "--reason", "UTF"], env, root)
    assert "\\xff\\xfe" in "".join(bad.stdout.split())


def test_bad_arguments_are_one_line_and_exit_2(ran: Any) -> None:
    env, root, _ = ran
    for args in (
        ["dl_events", "--date", "2026-13-01"],
        ["no_such_pipeline"],
        ["dl_events", "--limit", "0"],
        ["dl_events", "--limit", "many"],
    ):
        done = _sluice(["dead-letters", *args], env, root)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        (line,) = done.stderr.strip().splitlines()
        assert line.startswith("sluice: usage error: "), line
