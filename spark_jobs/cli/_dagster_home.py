"""The local Dagster home of ``make ui`` (``sluice dagster-home``): ``<SLUICE_HOME>/dagster``.

Its ``dagster.yaml`` turns telemetry off and turns off the first-visit "Join the Dagster
community" dialog, which ``dagster-webserver`` shows over whatever page a browser opens on
127.0.0.1/localhost until someone dismisses it: the UI asks ``shouldShowNux``, answered by the
instance's ``nux: enabled`` setting (and a ``.nux/nux.yaml`` marker once dismissed).

It also bounds the run queue as the compose deployment's ``docker/dagster.yaml`` does: Dagster's
default lets 10 runs start at once, and a reporter catching up on many completed days (a
continuous run that reopened days with late records, a first ``dagster dev`` over a history)
requests one checks' run per day, each a Python process of its own (a trial's continuous run
that reopened days queued 17 of them and held a 2-core machine at a load of 14 for about 8
minutes). Here: 4 runs at once, one checks' run per pipeline (tag
``sluice/checks``), one continuous run per pipeline (``sluice/continuous``), two backfills.

An existing ``dagster.yaml`` is kept: a missing ``telemetry``, ``nux`` or ``run_coordinator``
block is appended; a value the user set is left as it is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]  # (a dependency of dagster)

from enumerator_service import ConfigError

__all__ = ["DAGSTER_YAML_DEFAULTS", "prepare_dagster_home"]

#: The settings every Dagster home Sluice creates has (unless the user set them otherwise).
#: ``run_coordinator`` is ``docker/dagster.yaml``'s, and its tags are ``dagster_project``'s
#: ``CONTINUOUS_TAG`` and ``CHECKS_TAG`` (this package may not import that one): tests hold
#: the block equal to docker's and the tags to those constants.
DAGSTER_YAML_DEFAULTS: dict[str, dict[str, Any]] = {
    "telemetry": {"enabled": False},
    "nux": {"enabled": False},
    "run_coordinator": {
        "module": "dagster",
        "class": "QueuedRunCoordinator",
        "config": {
            "max_concurrent_runs": 4,
            "tag_concurrency_limits": [
                {
                    "key": "sluice/continuous",
                    "value": {"applyLimitPerUniqueValue": True},
                    "limit": 1,
                },
                {"key": "sluice/checks", "value": {"applyLimitPerUniqueValue": True}, "limit": 1},
                {"key": "dagster/backfill", "limit": 2},
            ],
        },
    },
}

_HEADER = (
    "# Dagster instance of Sluice's local UI (written by `sluice dagster-home`, `make ui`).\n"
    "# telemetry: off; nux: no first-visit 'Join the Dagster community' dialog;\n"
    "# run_coordinator: at most 4 runs at once, one checks' run and one continuous run per\n"
    "# pipeline, two backfills.\n"
)


def prepare_dagster_home(home: Path) -> Path:
    """Create ``home`` with a ``dagster.yaml`` holding :data:`DAGSTER_YAML_DEFAULTS`; its
    absolute path. ConfigError (naming ``DAGSTER_HOME``) if an existing file is not a YAML
    mapping or the folder cannot be written."""
    home = home.absolute()
    config = home / "dagster.yaml"
    try:
        home.mkdir(parents=True, exist_ok=True)
        text = config.read_text() if config.exists() else ""
    except OSError as exc:
        raise ConfigError("DAGSTER_HOME", f"cannot use {home}: {exc.strerror}") from None
    try:
        current = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError:
        current = None
    if not isinstance(current, dict):
        raise ConfigError("DAGSTER_HOME", f"{config} is not a YAML mapping")
    missing = {key: value for key, value in DAGSTER_YAML_DEFAULTS.items() if key not in current}
    if missing:
        addition = yaml.safe_dump(missing, default_flow_style=False, sort_keys=False)
        prefix = _HEADER if not text.strip() else ("" if text.endswith("\n") else "\n")
        try:
            config.write_text(text + prefix + addition)
        except OSError as exc:
            raise ConfigError("DAGSTER_HOME", f"cannot write {config}: {exc.strerror}") from None
    return home
