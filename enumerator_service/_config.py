"""Typed settings for every Sluice process (CLI, Dagster, Spark driver and tasks).

One pydantic-settings object with the ``SLUICE_`` environment prefix. Nothing here reads the
environment at import time: call :func:`load_settings` (or build :class:`Settings` directly).
"""

from __future__ import annotations

import re
from datetime import date
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = [
    "ConfigError",
    "Settings",
    "load_settings",
    "redact_url",
    "validate_identifier",
]

_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


class ConfigError(Exception):
    """A setting is invalid or unusable. ``str(error)`` is one line naming the setting."""

    def __init__(self, setting: str, problem: str) -> None:
        super().__init__(f"{setting}: {problem}")
        self.setting = setting
        self.problem = problem


def validate_identifier(value: str, setting: str = "identifier") -> str:
    """Return ``value`` if it is a plain lower-case SQL identifier, else raise ConfigError.

    Identifiers from configuration are interpolated into SQL (values never are), so only
    ``[a-z_][a-z0-9_]*`` of at most 63 characters is accepted.
    """
    if not _IDENTIFIER.fullmatch(value):
        raise ConfigError(
            setting, f"{value!r} is not a valid identifier (use lower-case letters, digits, _)"
        )
    return value


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (safe for logs and metadata)."""
    return re.sub(r"(?<=://)([^:/@?]*):([^@/?]*)@", r"\1:***@", url)


class Settings(BaseSettings):
    """Every knob of Sluice. Environment variables are ``SLUICE_<FIELD>`` in upper case."""

    model_config = SettingsConfigDict(
        env_prefix="SLUICE_", extra="ignore", validate_default=True, frozen=True
    )

    database_url: SecretStr | None = Field(
        default=None,
        description="Postgres URL. Unset: an embedded PostgreSQL under <home>/pg is used.",
    )
    home: Path = Field(
        default=Path(".sluice"), description="State folder (embedded Postgres, Dagster)."
    )
    data_dir: Path = Field(default=Path("data"), description="Root of landing and warehouse data.")
    pipelines: str = Field(
        default="",
        description="Comma-separated Python modules whose top-level Pipeline objects Sluice "
        "runs (e.g. examples.orders,examples.clickstream).",
    )
    warehouse_dir: Path | None = Field(
        default=None, description="Output root (default <data_dir>/warehouse)."
    )
    spark_master: str = Field(default="local[*]", description="Spark master URL.")
    spark_driver_host: str | None = Field(
        default=None,
        description="Address executors use to reach the driver (cluster masters only; "
        "default: this host's name). Local masters stay on 127.0.0.1.",
    )
    parallelism: int = Field(default=2, ge=1, le=256, description="Reader subtasks per run.")
    lookup_capacity: int = Field(
        default=8,
        ge=1,
        description="Default capacity of a Lookup step: blocks of records in flight per task.",
    )
    lookup_batch_size: int = Field(
        default=4096, ge=1, description="Default distinct keys per lookup query (a block's keys)."
    )
    lookup_pool_size: int = Field(
        default=4, ge=1, le=32, description="asyncpg connections per task."
    )
    lookup_timeout_seconds: float = Field(
        default=30.0, gt=0, description="Bound on one lookup, all retries included."
    )
    lookup_retries: int = Field(
        default=3,
        ge=0,
        le=20,
        description="Default retries of a Lookup step's failed query (exponential backoff).",
    )
    lookup_injected_latency_ms: float = Field(
        default=0.0,
        ge=0,
        description="Benchmarks only: sleep this long per lookup round trip (simulated network).",
    )
    lease_seconds: float = Field(default=60.0, gt=0, description="Split lease before reassignment.")
    checkpoint_interval_seconds: float = Field(
        default=5.0,
        ge=0,
        description="Trigger a checkpoint this often (0: only when a subtask's input ends).",
    )
    continuous_poll_seconds: float = Field(
        default=1.0, gt=0, description="A continuous reader asks for new splits this often."
    )
    continuous_idle_seconds: float = Field(
        default=0.0,
        ge=0,
        description="A continuous reader run ends after this long without a new split "
        "(0: runs until cancelled).",
    )
    checkpoint_timeout_seconds: float = Field(
        default=60.0, gt=0, description="Abort a checkpoint not acknowledged by then."
    )
    checkpointing_mode: Literal["EXACTLY_ONCE", "AT_LEAST_ONCE"] = Field(
        default="EXACTLY_ONCE",
        description="EXACTLY_ONCE: aligned, two-phase commit. AT_LEAST_ONCE: no alignment, "
        "each subtask commits its own snapshot (replays may duplicate, never lose).",
    )
    discovery_max_files_per_tick: int = Field(
        default=50_000,
        ge=1,
        le=1_000_000,
        description="A continuous discovery tick (sensor tick, `sluice discover` step) registers "
        "at most this many new files, oldest first; the rest is a backlog the next tick "
        "continues. Keeps a tick over a large backlog far below Dagster's 60 s evaluation limit "
        "(5-8 s per tick over a 1M-file backlog on the 2-core reference machine, "
        "bench/enumerator.py --backlog-only).",
    )
    target_split_bytes: int = Field(
        default=128 << 20, ge=1024, description="Files larger than this are cut into byte ranges."
    )
    max_line_bytes: int = Field(
        default=1 << 20, ge=64, description="Longer lines are dead-lettered."
    )
    read_block_bytes: int = Field(
        default=256 << 10,
        ge=1024,
        description="JSON Lines are read, parsed and looked up in blocks of about this size.",
    )
    # Sizes for the pipelines' sample-data generators (``sluice demo-data``).
    demo_events: int = Field(default=200_000, ge=1, description="Sample records generated.")
    demo_users: int = Field(default=1_000_000, ge=1, description="Sample dimension rows generated.")
    demo_days: int = Field(default=3, ge=1, le=366, description="Days of sample records.")
    demo_files_per_day: int = Field(default=4, ge=1, description="Sample files per day.")
    demo_start_date: date = Field(default=date(2026, 1, 1), description="First sample day.")
    demo_seed: int = Field(default=7, description="Seed of the sample data generators.")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(default="WARNING")

    # -- issue 13, cluster part: gang scheduling and Spark authentication ------------------
    spark_slot_wait_seconds: float = Field(
        default=30.0,
        ge=0,
        le=3600,
        description="How long a run on a cluster master waits for SLUICE_PARALLELISM task "
        "slots (executors still registering) before it fails; local masters fail at once.",
    )
    spark_auth_secret: SecretStr | None = Field(
        default=None,
        description="Shared secret for spark.authenticate (the master and workers need the "
        "same one). Never logged.",
    )
    spark_auth_secret_file: Path | None = Field(
        default=None,
        description="File holding the spark.authenticate secret (instead of "
        "SLUICE_SPARK_AUTH_SECRET).",
    )

    @field_validator("pipelines")
    @classmethod
    def _modules(cls, value: str) -> str:
        for name in value.split(","):
            if name.strip() and not _MODULE.fullmatch(name.strip()):
                raise ValueError(f"{name.strip()!r} is not a Python module name")
        return value

    @property
    def pipeline_modules(self) -> list[str]:
        """The modules named by ``SLUICE_PIPELINES``, in order, without repeats."""
        names = [name.strip() for name in self.pipelines.split(",") if name.strip()]
        return list(dict.fromkeys(names))

    @field_validator("database_url")
    @classmethod
    def _postgres_url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not re.match(
            r"^postgres(ql)?(\+\w+)?://", value.get_secret_value()
        ):
            raise ValueError("must be a postgresql:// URL")
        return value

    @property
    def data_path(self) -> Path:
        return self.data_dir.absolute()

    @property
    def warehouse_path(self) -> Path:
        return (self.warehouse_dir or self.data_dir / "warehouse").absolute()

    @property
    def home_path(self) -> Path:
        return self.home.absolute()


def load_settings(**overrides: Any) -> Settings:
    """Build Settings from the environment plus ``overrides``; ConfigError on a bad value."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = str(error["loc"][0]) if error["loc"] else "settings"
        message = str(error["msg"]).removeprefix("Value error, ")
        raise ConfigError(f"SLUICE_{field.upper()}", message) from None
