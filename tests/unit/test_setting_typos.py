"""A ``SLUICE_*`` variable one letter off a setting is a warning; one's own variables are not."""

from __future__ import annotations

import logging

import pytest

from enumerator_service import Settings
from enumerator_service._setting_typos import misspelled_settings, warn_misspelled_settings

FIELDS = list(Settings.model_fields)


def test_a_near_miss_is_named_with_the_setting_it_resembles() -> None:
    environ = {
        "SLUICE_MAX_WATERMARK_LAG_SECOND": "30",  # one letter short
        "SLUICE_CHECKPOINT_INTERVAL_SECNDS": "1",
        "SLUICE_PIPELINES": "examples.orders",  # a setting
        "SLUICE_ORDERS_DB_URL": "postgresql://…",  # a url_env of one's own
        "SLUICE_SHOP_DATABASE_URL": "postgresql://…",  # (contains a setting's name)
        "SLUICE_DATABASE_URL_2": "postgresql://…",
        "SLUICE_LOG_LEVL": "DEBUG",  # a letter short
        "SLUICE_TEST_HOME": "home",
        "PATH": "/usr/bin",
    }
    assert misspelled_settings(environ, FIELDS) == [
        "SLUICE_CHECKPOINT_INTERVAL_SECNDS is not a setting (did you mean"
        " SLUICE_CHECKPOINT_INTERVAL_SECONDS?): ignored",
        "SLUICE_LOG_LEVL is not a setting (did you mean SLUICE_LOG_LEVEL?): ignored",
        "SLUICE_MAX_WATERMARK_LAG_SECOND is not a setting (did you mean"
        " SLUICE_MAX_WATERMARK_LAG_SECONDS?): ignored",
    ]


def test_each_near_miss_is_warned_once_per_process(caplog: pytest.LogCaptureFixture) -> None:
    environ = {"SLUICE_PARALELLISM": "2"}
    with caplog.at_level(logging.WARNING):
        warn_misspelled_settings(environ, FIELDS)
        warn_misspelled_settings(environ, FIELDS)
    said = [r.getMessage() for r in caplog.records if "PARALELLISM" in r.getMessage()]
    assert said == [
        "SLUICE_PARALELLISM is not a setting (did you mean SLUICE_PARALLELISM?): ignored"
    ]
