"""Typed settings for every Sluice process (CLI, Dagster, Spark driver and tasks).

One pydantic-settings object with the ``SLUICE_`` environment prefix. Nothing here reads the
environment at import time: call :func:`load_settings` (or build :class:`Settings` directly).
"""

from __future__ import annotations

import os
import re
from datetime import date
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from enumerator_service._secrets import redact_url, split_password
from enumerator_service._setting_typos import warn_misspelled_settings

__all__ = [
    "ConfigError",
    "ServerUnreachable",
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


class ServerUnreachable(ConfigError):
    """A server a setting names does not answer: an outage (or a wrong address, which looks
    the same from here). One line naming the setting, like any ConfigError; a run that meets
    it ends with exit code 1 (run it again once the server is back), not 2."""


def validate_identifier(value: str, setting: str = "identifier") -> str:
    """Return ``value`` if it is a plain lower-case SQL identifier, else raise ConfigError.

    Only ``[a-z_][a-z0-9_]*`` of at most 63 characters (Postgres' limit) is accepted: no
    quote, NUL, space, dot or upper case. Reserved words (``order``, ``user``) are fine: the
    name is always quoted where it reaches SQL (:func:`~enumerator_service.quote_identifier`),
    and lower case only means the quoted name and the one a user types unquoted in psql agree.
    """
    if not isinstance(value, str) or not _IDENTIFIER.fullmatch(value):
        raise ConfigError(
            setting,
            f"{value!r} is not a valid identifier (use lower-case letters, digits, _; max 63)",
        )
    return value


class Settings(BaseSettings):
    """Every knob of Sluice. Environment variables are ``SLUICE_<FIELD>`` in upper case."""

    model_config = SettingsConfigDict(
        env_prefix="SLUICE_",
        extra="ignore",
        validate_default=True,
        frozen=True,
        # A rejected value may be a URL with its password: errors never repeat the input.
        hide_input_in_errors=True,
    )

    database_url: SecretStr | None = Field(
        default=None,
        description="Postgres URL of the platform database (postgresql://user:password@host/db). "
        "Unset: an embedded PostgreSQL under <home>/pg. Percent-encode @ / : ? # % in a user "
        "name or password; the password may instead be in SLUICE_DATABASE_PASSWORD or "
        "SLUICE_DATABASE_PASSWORD_FILE (in one place only). Shown redacted everywhere.",
    )
    home: Path = Field(
        default=Path(".sluice"),
        description="State folder: the embedded PostgreSQL (<home>/pg) and the local Dagster "
        "home (<home>/dagster).",
    )
    data_dir: Path = Field(
        default=Path("data"),
        description="Root of the landing folders (<data_dir>/landing/<pipeline> by default) and "
        "of the warehouse.",
    )
    pipelines: str = Field(
        default="",
        description="Comma-separated Python modules whose top-level Pipeline objects Sluice "
        "runs (e.g. examples.orders,examples.clickstream).",
    )
    warehouse_dir: str | None = Field(
        default=None,
        description="Output root: a local folder, file://…, or an object-store URI "
        "(s3://bucket/prefix first-class; gs://, abfs://, hdfs:// through the same pyarrow.fs "
        "code). Default <data_dir>/warehouse.",
    )
    spark_master: str = Field(
        default="local[*]",
        description="Spark master URL (local[N], spark://host:7077). Local masters get the "
        "same task attempts as a cluster (local[N,F]).",
    )
    spark_driver_host: str | None = Field(
        default=None,
        description="Address executors use to reach the driver (cluster masters only; "
        "default: this host's name). Local masters stay on 127.0.0.1.",
    )
    parallelism: int = Field(
        default=2, ge=1, le=256, description="Reader subtasks (Spark tasks) per run."
    )
    lookup_capacity: int = Field(
        default=8,
        ge=1,
        description="Default capacity of a Lookup step: blocks of records in flight per task.",
    )
    lookup_batch_size: int = Field(
        default=4096, ge=1, description="Default distinct keys per lookup query (a block's keys)."
    )
    lookup_pool_size: int = Field(
        default=4,
        ge=1,
        le=32,
        description="Postgres connections per task for lookups (at most this many queries "
        "at once).",
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
    lease_seconds: float = Field(
        default=60.0,
        gt=0,
        description="Split lease: a dead run's splits return to the pool after it.",
    )
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
    max_watermark_lag_seconds: float = Field(
        default=3600.0,
        gt=0,
        description="The output's watermark_freshness check fails when a pipeline's watermark "
        "is further behind now than this.",
    )
    checkpoint_timeout_seconds: float = Field(
        default=60.0, gt=0, description="Abort a checkpoint not acknowledged by then."
    )
    checkpoint_history_seconds: float = Field(
        default=300.0,
        ge=0,
        description="A run keeps the bookkeeping (checkpoint rows, snapshots) of its last two "
        "completed checkpoints, and of older ones for this long; older ones are deleted as "
        "checkpoints complete.",
    )
    bookkeeping_retention_hours: float = Field(
        default=168.0,
        gt=0,
        description="The checkpoint bookkeeping of a run that is over is deleted (at a later "
        "run's start) once the run has had no checkpoint for this long.",
    )
    dagster_partitions: Literal["daily", "discovered"] = Field(
        default="discovered",
        description="The partitions Dagster offers for a day-partitioned output: discovered: "
        "the days that have input or output (dynamic partitions, added by the "
        "<pipeline>_report_completions sensor), or daily: every day from the pipeline's "
        "start_date (else its earliest landing day) to today.",
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
        default=128 << 20,
        ge=1024,
        description="Uncompressed JSON Lines and CSV files larger than this are cut into "
        "byte-range splits.",
    )
    max_line_bytes: int = Field(
        default=1 << 20,
        ge=64,
        description="Longer JSON Lines and CSV lines are dead-lettered (line too long).",
    )
    read_block_bytes: int = Field(
        default=256 << 10,
        ge=1024,
        description="JSON Lines and CSV files are read, parsed and looked up in blocks of "
        "about this many bytes of whole lines.",
    )
    # Issue 15: many small files must not make the split store the bottleneck. A reader
    # subtask takes several small splits per request; the byte budget bounds the work one
    # subtask can hold unread while others are idle: 1 MiB is ~0.1 s of reading, while one
    # request costs a few ms, so only splits far smaller than the budget are worth batching.
    pull_max_splits: int = Field(
        default=16,
        ge=1,
        le=1000,
        description="Most splits a reader subtask pulls in one request (1: one at a time).",
    )
    pull_max_bytes: int = Field(
        default=1 << 20,
        ge=0,
        description="A request takes more than one split only while their byte sizes add up "
        "to at most this; splits of unknown size (gzip, Parquet, tables) always go alone.",
    )
    # Sizes for the pipelines' sample-data generators (``sluice demo-data``).
    demo_events: int = Field(default=200_000, ge=1, description="Sample records generated.")
    demo_users: int = Field(default=1_000_000, ge=1, description="Sample dimension rows generated.")
    demo_days: int = Field(default=3, ge=1, le=366, description="Days of sample records.")
    demo_files_per_day: int = Field(default=4, ge=1, description="Sample files per day.")
    demo_start_date: date = Field(default=date(2026, 1, 1), description="First sample day.")
    demo_seed: int = Field(default=7, description="Seed of the sample data generators.")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="WARNING", description="Python log level of the sluice CLI (its root logger)."
    )
    max_dead_letter_ratio: float = Field(
        default=0.05,
        ge=0.0,
        le=1.0,
        description="A pipeline's dead_letter_ratio asset check fails for a partition whose "
        "dead letters are more than this share of its records (rows written + dead letters).",
    )

    # -- Issue 13, identifiers and symlinks: links in landing folders -------------------------
    follow_symlinks: bool = Field(
        default=False,
        description="Follow symbolic links in a landing folder that lead out of it. Off: such "
        "links (files or dt= folders) are skipped by discovery, logged once and counted, and "
        "refused at read time if one was swapped in after discovery; links whose target is "
        "inside the landing folder are always followed.",
    )

    # -- issue 22, files anywhere: object stores through pyarrow.fs ----------------------
    s3_endpoint_url: str | None = Field(
        default=None,
        description="Endpoint of an S3-compatible store (e.g. http://127.0.0.1:9000 for "
        "MinIO); unset: AWS. Credentials come from the standard AWS chain (AWS_ACCESS_KEY_ID "
        "and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, the instance role), never from a setting.",
    )
    s3_region: str | None = Field(
        default=None,
        description="Region of the S3 buckets (unset: AWS_REGION / AWS_DEFAULT_REGION, the "
        "profile, else the client's default).",
    )

    # -- issue 21, files are immutable or detected ------------------------------------------
    file_settle_seconds: float = Field(
        default=2.0,
        ge=0,
        le=600,
        description="A landing file is registered only once it has been quiet this long (no "
        "change to its mtime or ctime): a file still being written is left for a later "
        "discovery (`sluice discover` waits for it up to three times this long).",
    )
    file_change_policy: Literal["refuse", "reprocess"] = Field(
        default="refuse",
        description="A file whose size, mtime or inode changed after it was registered "
        "(replaced, re-created, appended to): `refuse` quarantines its splits with the change "
        "as the reason (`sluice retry` reads it as it is then); `reprocess` reads it whole "
        "again as a new version (its older output stays).",
    )

    # -- issue 13, poison splits (quarantine) ----------------------------------------------
    split_max_attempts: int = Field(
        default=3,
        ge=1,
        le=1000,
        description="Failed attempts on a split's own content (corrupt gzip or Parquet, bad "
        "CSV header, file gone) before the split is quarantined as FAILED.",
    )

    # -- change data capture -----------------------------------------------------------------
    cdc_max_retained_wal_mb: int = Field(
        default=1024,
        ge=1,
        description="WAL a CDC source's replication slot may keep on the source server (MB) "
        "before its Dagster check fails (the slot is behind, or forgotten: drop it with "
        "'sluice cdc drop').",
    )

    # -- Secrets (issue 13, part "secrets"): the database password kept out of the URL, so a
    # cluster's executors can get it from their own environment (see database_url()).
    database_password: SecretStr | None = Field(
        default=None,
        description="Password of SLUICE_DATABASE_URL when the URL holds none (executors on a "
        "cluster read it from their environment).",
    )
    database_password_file: Path | None = Field(
        default=None,
        description="File whose first line is the password of SLUICE_DATABASE_URL (a mounted "
        "secret); must exist "
        "at the same path on every executor.",
    )

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

    @field_validator("warehouse_dir", mode="before")
    @classmethod
    def _folder_text(cls, value: Any) -> Any:
        # A Path is accepted as before (kept as its text: a URI must keep its '//').
        return os.fspath(value) if isinstance(value, os.PathLike) else value

    @field_validator("database_url")
    @classmethod
    def _postgres_url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return value
        url = value.get_secret_value()
        if not re.match(r"^postgres(ql)?(\+\w+)?://", url):
            raise ValueError(f"must be a postgresql:// URL, not {redact_url(url)}")
        try:
            split_password(url)
        except ValueError as exc:
            raise ValueError(
                f"{exc} (percent-encode @ / : ? # % in user names and passwords, e.g. %40)"
            ) from None
        return value

    @property
    def data_path(self) -> Path:
        return self.data_dir.absolute()

    @property
    def warehouse_uri(self) -> str:
        """The output root as given: an absolute local folder, or a URI (``s3://…``)."""
        given = self.warehouse_dir
        if given is None:
            return str((self.data_dir / "warehouse").absolute())
        text = os.fspath(given)  # (a Path set through model_copy skips validation)
        return text if "://" in text else str(Path(text).absolute())

    @property
    def warehouse_path(self) -> Path:
        """The output root as a local folder; ConfigError when it is on an object store
        (use ``warehouse_uri`` / ``spark_jobs.pipeline._paths.warehouse_root``)."""
        from enumerator_service._storage import open_location

        location = open_location(self.warehouse_uri, what="SLUICE_WAREHOUSE_DIR")
        if location.object_store:
            raise ConfigError("SLUICE_WAREHOUSE_DIR", f"{location.uri} is not a local folder")
        return location.local_path

    @property
    def home_path(self) -> Path:
        return self.home.absolute()


def load_settings(**overrides: Any) -> Settings:
    """Build Settings from the environment plus ``overrides``; ConfigError on a bad value."""
    warn_misspelled_settings(os.environ, Settings.model_fields)
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = str(error["loc"][0]) if error["loc"] else "settings"
        message = str(error["msg"]).removeprefix("Value error, ")
        raise ConfigError(f"SLUICE_{field.upper()}", message) from None
