"""The CLI console's width: the terminal's, ``COLUMNS``, or wide when piped."""

from __future__ import annotations

import io

import pytest

from spark_jobs.cli import _common


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("tty", "columns", "width"),
    [(False, None, _common.PIPED_WIDTH), (True, None, None), (False, "120", None)],
)
def test_piped_output_is_wide_unless_told(
    monkeypatch: pytest.MonkeyPatch, tty: bool, columns: str | None, width: int | None
) -> None:
    monkeypatch.setattr("sys.stdout", _Tty() if tty else io.StringIO())
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    assert _common._width() == width
