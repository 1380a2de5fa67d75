"""The settings of issue 14's Dagster reporting: bad values are one line naming the setting."""

from __future__ import annotations

import pytest

from enumerator_service import ConfigError, load_settings


@pytest.mark.parametrize(
    ("overrides", "setting"),
    [
        ({"max_watermark_lag_seconds": 0}, "SLUICE_MAX_WATERMARK_LAG_SECONDS"),
        ({"max_watermark_lag_seconds": -5}, "SLUICE_MAX_WATERMARK_LAG_SECONDS"),
        ({"dagster_partitions": "weekly"}, "SLUICE_DAGSTER_PARTITIONS"),
    ],
)
def test_a_bad_value_names_its_setting(overrides: dict[str, object], setting: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load_settings(**overrides)
    message = str(raised.value)
    assert message.startswith(setting) and "\n" not in message


def test_defaults() -> None:
    settings = load_settings()
    assert settings.max_watermark_lag_seconds == 3600.0
    assert settings.dagster_partitions == "discovered"


def test_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_MAX_WATERMARK_LAG_SECONDS", "90")
    monkeypatch.setenv("SLUICE_DAGSTER_PARTITIONS", "daily")
    settings = load_settings()
    assert (settings.max_watermark_lag_seconds, settings.dagster_partitions) == (90.0, "daily")
