"""Durations in pipeline settings (``expire_after_write``, ``retry_delay``, timeouts): text
with a unit, numbers, timedeltas; a bad one fails naming its setting, a negative one says so
(not "not a duration")."""

from __future__ import annotations

from datetime import timedelta

import pytest

from spark_jobs.pipeline._types import seconds


@pytest.mark.parametrize(
    ("value", "expected"),
    [("500ms", 0.5), ("10s", 10.0), ("5m", 300.0), ("2h", 7200.0), ("1d", 86400.0), ("7", 7.0),
     (" 1.5 s ", 1.5), (3, 3.0), (0.25, 0.25), (timedelta(minutes=2), 120.0), ("0", 0.0)],
)  # fmt: skip
def test_durations_in_every_accepted_form(value: object, expected: float) -> None:
    assert seconds(value, "retry_delay") == expected  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["-5m", "-0.5s", -1, timedelta(seconds=-3)])
def test_a_negative_duration_says_it_is_negative(value: object) -> None:
    with pytest.raises(ValueError, match=r"^expire_after_write: a duration must not be negative"):
        seconds(value, "expire_after_write")  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["5 minutes", "m", "", "1e3s", True, None, [1]])
def test_anything_else_is_not_a_duration(value: object) -> None:
    with pytest.raises(ValueError, match=r"^timeout: .* is not a duration"):
        seconds(value, "timeout")  # type: ignore[arg-type]
