"""The spec of the files source: what a user writes in a pipeline definition."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date
from os import PathLike
from typing import Literal

from spark_jobs.pipeline._sources import LatePolicy
from spark_jobs.pipeline._types import Duration, TypeSpec

__all__ = ["FileSource"]


@dataclass(frozen=True)
class FileSource:
    """Files landing in a folder (or an object-store prefix); the format of each file comes
    from its name.

    Formats by extension: `.jsonl`/`.json` (JSON Lines), `.csv` (with a header line), either
    gzip-compressed (`.jsonl.gz`, `.csv.gz`), and `.parquet`. Files whose names start with
    `.` or `_` are ignored: write under such a name, then rename.

    ```python
    from spark_jobs import FileSource

    source = FileSource(
        schema={"event_id": "string", "user_id": "int64", "ts": "timestamp"},
        required=["event_id", "ts"],
        event_time="ts",
        landing="landing/events",  # under SLUICE_DATA_DIR
    )
    ```

    Every format's values are converted to the declared types the same way: absent or null
    (an empty CSV field) is null; integers must be integers within the type's range (`1.0`,
    `true` or `"5"` are wrong types in JSON); `timestamp` takes ISO-8601 text (no offset
    means UTC), `date` takes `YYYY-MM-DD`; a `decimal(p,s)` value must fit without rounding.
    A record that does not convert is a dead letter (see the dead-letter reference).

    Symbolic links are followed only when they lead somewhere inside the landing folder
    (unless `SLUICE_FOLLOW_SYMLINKS=true`). A landing file is registered once it has not
    changed for `SLUICE_FILE_SETTLE_SECONDS`; one that changes after it was registered is
    quarantined or read again (`SLUICE_FILE_CHANGE_POLICY`).

    Args:
        schema: Field name → type (`"string"`, `"int64"`, `"decimal(12,2)"`, `"timestamp"`,
            …). Only these fields are read; other fields of a record are ignored.
        required: Fields that must be present and not null; a record without one is a dead
            letter (`missing field: …`). Other fields are null when absent.
        event_time: A `timestamp` field: per-split watermarks (bounded out-of-orderness
            `out_of_orderness`, idle after `idle_timeout`) flow through every step to the
            sink, and output days complete by event time. `None`: no watermarks.
        partition_by: `"day"`: files live in `<landing>/dt=YYYY-MM-DD/` folders named after
            their records' event day; the day is the output partition (`dt=` folders or a
            `dt` column) and the Dagster partition. `None`: files directly in `<landing>`,
            output and asset unpartitioned.
        landing: The folder (a relative path is under `SLUICE_DATA_DIR`, without `..`), or a
            URI: `file://…`, `s3://bucket/prefix` (also `gs://`, `abfs://`, `hdfs://`).
            Default: `<SLUICE_DATA_DIR>/landing/<pipeline name>`.
        start_date: First Dagster partition. Default: the earliest `dt=` folder found when
            the code location loads, else today.
        out_of_orderness: How far behind the latest event time a record may arrive without
            being late for the watermark (a duration: `"5s"`, `10`, `timedelta`).
        idle_timeout: A split that has produced no record for this long stops holding the
            watermark back.
        late_records: A record whose event day is an output partition already recorded
            complete: `"dead_letter"` (a dead letter with reason `late`) or `"reopen"`
            (written to its partition, which completes again as a new generation).
    """

    schema: Mapping[str, TypeSpec]
    required: Sequence[str] = ()
    event_time: str | None = None
    partition_by: Literal["day"] | None = "day"
    landing: str | PathLike[str] | None = None
    start_date: date | str | None = None
    out_of_orderness: Duration = "5s"
    idle_timeout: Duration = "60s"
    late_records: LatePolicy = "reopen"
