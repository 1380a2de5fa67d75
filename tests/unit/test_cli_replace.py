"""``sluice run --date D --replace`` that replaced nothing says so in one line and exits 2
(it printed "Nothing new to process" and exited 0: the user believed D was replaced)."""

from __future__ import annotations

from datetime import date
from typing import Any

import pytest

import spark_jobs.jobs
from spark_jobs._outcomes import ExitCode
from spark_jobs.cli import _runs
from spark_jobs.jobs._summary import RunSummary


class _Pipeline:
    name = "clicks"


def _summary(rebuilt: tuple[str, ...], nothing: bool) -> RunSummary:
    done = RunSummary.nothing("clicks", "r1", 0.1)
    return (
        done
        if nothing
        else RunSummary("clicks", "r1", 4, 9, 9, 0, 0, 0.1, 90.0, False, rebuilt=rebuilt)
    )


def _run(monkeypatch: pytest.MonkeyPatch, summary: RunSummary, *, rebuild: bool) -> None:
    def run_pipeline(*_args: Any, **_kwargs: Any) -> RunSummary:
        return summary

    monkeypatch.setattr(spark_jobs.jobs, "run_pipeline", run_pipeline)
    _runs._run(Any, _Pipeline(), [date(2026, 11, 20)], rebuild=rebuild)  # type: ignore[arg-type]


def test_a_replace_that_replaced_nothing_is_one_line_and_exit_code_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        _run(monkeypatch, _summary((), nothing=True), rebuild=True)
    assert e.value.code == ExitCode.USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nothing of 2026-11-20 was replaced" in err, err


def test_a_replace_that_replaced_the_day_and_a_plain_run_with_nothing_new_exit_0(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(_runs, "run_table", lambda *_a: "replaced partitions: 2026-11-20")
    _run(monkeypatch, _summary(("2026-11-20",), nothing=False), rebuild=True)
    _run(monkeypatch, _summary((), nothing=True), rebuild=False)
    assert capsys.readouterr().err == ""
