"""How the CLI shows pipelines, runs and statuses (rich tables, or JSON for ``--json``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from enumerator_service import (
    END_OF_INPUT,
    ENDED_WORDS,
    LiveState,
    PlatformStatus,
    QuarantinedSplit,
    Settings,
    SplitStatus,
)
from spark_jobs.connectors._registry import sink_connector_named
from spark_jobs.jobs._summary import RunSummary
from spark_jobs.pipeline import Pipeline
from spark_jobs.pipeline._describe import describe
from spark_jobs.pipeline._plan import Plan

__all__ = [
    "describe_table",
    "failed_line",
    "kafka_lag_line",
    "left_lines",
    "nothing_line",
    "run_table",
    "status_json",
    "status_table",
]


def _plain_row(table: Table, *cells: RenderableType) -> None:
    """``table.add_row`` with text cells taken literally: names, patterns, paths and
    reasons come from users and data (``payments(-[a-z]+)?`` is not markup)."""
    table.add_row(*(Text(cell) if isinstance(cell, str) else cell for cell in cells))


def describe_table(
    pipeline: Pipeline,
    plan: Plan | None,
    landing: str | None,
    note: str | None,
    *,
    error: bool = False,
) -> RenderableType:
    """A pipeline's source, steps, sink and output fields; ``note``: why the definition was not
    checked against the database (``error``: because it does not fit the database)."""
    described = describe(pipeline, plan, landing)
    table = Table(title=f"Pipeline {described.name}", show_header=False, title_justify="left")
    _plain_row(table, "source", described.source)
    _plain_row(table, "steps", "\n".join(described.steps) or "none")
    _plain_row(table, "sink", described.sink)
    fields = Table(show_header=True, box=None, pad_edge=False)
    for column in ("field", "type", "from"):
        fields.add_column(column)
    for name, kind, origin in described.output:
        _plain_row(fields, name, kind, origin)
    _plain_row(table, "output", fields)
    if note is not None and error:
        return Group(table, Text(f"  error: {note}", style="bold red"))
    if note is not None:
        # (a table not created yet: a lookup's or the source's own, so the types of what it
        # gives are not known yet — not an error, see ``sluice pipelines``)
        return Group(table, Text(f"  not checked against the database yet: {note}", style="dim"))
    return table


def run_table(summary: RunSummary, pipeline: Pipeline, settings: Settings) -> Table:
    table = Table(title=f"Run {summary.run_id} ({summary.pipeline})", show_header=False)
    rows = [
        ("splits", f"{summary.splits:,}"),
        ("rows in", f"{summary.rows_in:,}"),
        ("rows out", f"{summary.rows_out:,}"),
        ("removed by steps", f"{summary.dropped:,}"),
        ("dead letters", f"{summary.dead_letters:,}"),
        (
            "checkpoints (aborted)",
            f"{summary.checkpoints:,} ({summary.checkpoints_aborted:,}, "
            f"{summary.fenced:,} of them fenced)",
        ),
        (
            "checkpoint p50 / p99",
            f"{summary.checkpoint_p50_ms:.0f} / {summary.checkpoint_p99_ms:.0f} ms "
            f"(alignment p50 {summary.alignment_p50_ms:.0f} ms)",
        ),
        (
            "looked-up records (database queries)",
            f"{summary.lookups:,} ({summary.lookup_queries:,})",
        ),
        ("lookup cache hits", _cache_hits(summary)),
        ("lookup p50 / p99", f"{summary.lookup_p50_ms:.1f} / {summary.lookup_p99_ms:.1f} ms"),
        ("seconds", f"{summary.seconds:,.1f}"),
        # (over the whole run; `sluice status` shows the latest run's last minute)
        ("rows read/s (whole run)", f"{summary.rows_per_second:,.0f}"),
    ]
    for where, records_in, records_out in summary.steps:
        rows.append((f"  {where}", f"{records_in:,} → {records_out:,}"))
    sink = sink_connector_named(pipeline.plan.sink.kind)
    rows.append(("output", sink.location(pipeline, settings, ())))
    rows.append(("replaced partitions", ", ".join(summary.rebuilt) or "none"))
    if summary.other_days:
        rows.append(("other days' records (left as written)", f"{summary.other_days:,}"))
    for name, value in rows:
        _plain_row(table, name, value)
    return table


#: Quarantined splits listed by ``sluice status`` and a run (``status --json`` lists all).
_SHOWN_FAILED = 20


def _cache_hits(summary: RunSummary) -> str:
    """The cache row: hits of the keys asked, and the keys that bypassed a cache that did not
    pay (``min_hit_rate``); a dash when no Lookup step has a cache (not a 0 % hit rate)."""
    if summary.cache_keys == 0:
        return "— (no cache)"
    hits = f"{summary.cache_hit_rate:.1%} of the keys asked"
    return f"{hits}; {summary.cache_bypass_rate:.1%} of all keys bypassed it (min_hit_rate)"


def nothing_line(summary: RunSummary) -> str:
    """What a run that was assigned no split says: "Nothing new" only when nothing waits."""
    left, name = summary.left, summary.pipeline
    if left.held or left.rebuilding:
        return f"[bold]Nothing to process now[/] ({name}): the new input is held elsewhere."
    if left.retrying:
        return f"[bold]Nothing read[/] ({name}): splits that failed an attempt wait for a retry."
    if left.quarantined:
        return f"[bold]Nothing new to process[/] ({name}), but some input is quarantined."
    return (
        f"[bold]Nothing new to process[/] ({name}): every discovered split is already committed"
        f" (new input is registered by 'sluice discover {name}')."
    )


def left_lines(summary: RunSummary) -> list[str]:
    """The input of the run's scope it did not read, and why: quarantined splits (each with
    its reason), splits held by other live runs, splits waiting for a rebuild of their day;
    and a run whose every record went to the dead letters."""
    left, lines = summary.left, []
    if summary.dead_letters and not summary.rows_out and not summary.dropped:
        # Exit 0 (nothing is lost: each record is a dead letter with its reason), but a run
        # that wrote nothing at all is a schema or lookup mistake, not a success to skim.
        lines.append(
            f"no row written: every record read went to the dead letters "
            f"({summary.dead_letters:,}); `sluice status` lists them by reason"
        )
    if left.quarantined:
        lines.append(
            f"{len(left.quarantined):,} quarantined split(s), not in the output "
            "(`sluice retry --all-failed` puts them back):"
        )
        for split in left.quarantined[:_SHOWN_FAILED]:
            lines.append(f"  split {split.id}: {failed_line(split)}")
        if len(left.quarantined) > _SHOWN_FAILED:
            more = len(left.quarantined) - _SHOWN_FAILED
            lines.append(f"  … {more} more (`sluice status --json` lists them)")
    if left.held:
        runs = ", ".join(left.held_by)
        lines.append(
            f"{left.held:,} split(s) held by another run ({runs}): left to it, not read; if"
            f" that run died, its lease ends in {left.held_seconds:,.0f}s and the next run"
            " reads them"
        )
    if left.rebuilding:
        lines.append(
            f"{left.rebuilding:,} split(s) held until the rebuild of their day swaps: not read"
        )
    if left.returned:
        lines.append(
            f"{left.returned:,} split(s) assigned to this run were not read although its "
            "subtasks ended: back in the pool, the next run reads them (please report this)"
        )
    if left.retrying:
        lines.append(
            f"{len(left.retrying):,} split(s) failed an attempt on their content and are back "
            "in the pool, not in the output (the next run tries again; quarantined after "
            "SLUICE_SPLIT_MAX_ATTEMPTS failures):"
        )
        for split in left.retrying[:_SHOWN_FAILED]:
            lines.append(f"  split {split.id}: {split.line()}")
    return lines


def failed_line(split: QuarantinedSplit) -> str:
    """One line about a quarantined split: file, reason, attempts, last error (bounded)."""
    return split.line()


def status_table(status: PlatformStatus, held: Mapping[str, Any] | None = None) -> Table:
    """``held``: what the source holds on a server (``SourceConnector.source_status``)."""
    table = Table(title=f"Pipeline {status.source}", show_header=False)
    for state in SplitStatus:
        _plain_row(table, f"splits {state.value.lower()}", f"{status.splits.get(state, 0):,}")
    _plain_row(table, "rows committed", f"{status.rows_committed:,}")
    _plain_row(table, "removed by steps", f"{status.rows_dropped:,}")
    _plain_row(table, "dead letters", f"{status.dead_letters:,}")
    for reason, count in status.dead_letter_reasons:
        _plain_row(table, f"  {reason}", f"{count:,}")
    failed = status.quarantined
    for split in failed[:_SHOWN_FAILED]:
        _plain_row(table, f"  failed split {split.id}", failed_line(split))
    if len(failed) > _SHOWN_FAILED:
        _plain_row(table, "  …", f"{len(failed) - _SHOWN_FAILED} more (status --json lists them)")
    last = status.last_checkpoint
    _plain_row(
        table,
        "last checkpoint",
        f"{last['checkpoint_id']} of {last['run_id']} {last['status']} at "
        f"{last['completed_at'] or last['triggered_at']:%Y-%m-%d %H:%M:%S}"
        if last
        else "none",
    )
    done = status.completions
    if done is not None:
        waiting = f" ({done.unreported:,} not yet reported to Dagster)" if done.unreported else ""
        reopened = done.generations - done.partitions
        again = f", {reopened:,} completed again" if reopened else ""
        _plain_row(table, "partitions complete", f"{done.partitions:,}{again}{waiting}")
    if status.live is not None:
        _live_rows(table, status.live)
    _held_rows(table, held or {})
    return table


def _live_rows(table: Table, live: LiveState) -> None:
    """Watermark and throughput once a run completed a checkpoint; the backlog then, and
    before any run whenever splits wait."""
    ran = live.run_id is not None
    if ran:
        _plain_row(table, "watermark", _watermark_line(live))
    if ran or live.backlog_splits:
        _plain_row(table, "backlog", _backlog_line(live))
    if ran:
        rate = (
            ""
            if live.rows_per_second is None
            else f"{live.rows_per_second:,.1f} rows/s committed (last minute); "
        )
        took = live.last_checkpoint_seconds or 0.0
        _plain_row(table, "throughput", f"{rate}last checkpoint took {took:.1f}s")


def _held_rows(table: Table, held: Mapping[str, Any]) -> None:
    """A CDC slot as one line: active or not, retained WAL; other values as they are."""
    if "slot" in held:
        if held.get("slot_unknown"):
            _plain_row(table, "replication slot", f"{held['slot']} unknown: {held['slot_unknown']}")
        elif held.get("slot_dropped"):
            _plain_row(
                table,
                "replication slot",
                f"{held['slot']} DROPPED under the pipeline: changes since may be lost (run"
                " 'sluice cdc drop' for it, empty the sink, discover again)",
            )
        elif not held.get("slot_exists"):
            _plain_row(
                table, "replication slot", f"{held['slot']} not created yet (discovery creates it)"
            )
        else:
            state = "active" if held.get("slot_active") else "inactive"
            retained = int(held.get("retained_wal_bytes", 0)) / (1 << 20)
            _plain_row(
                table,
                "replication slot",
                f"{held['slot']} {state}, retains {retained:,.1f} MB of WAL"
                f" (confirmed {held.get('confirmed_flush_lsn')})",
            )
    if "kafka_unknown" in held:
        _plain_row(table, "message lag", f"unknown: {held['kafka_unknown']}")
    elif "kafka_lag_messages" in held:
        _plain_row(table, "message lag", kafka_lag_line(held))
    for name, value in held.items():
        if not name.startswith(("slot", "retained_wal", "confirmed_flush", "kafka_")):
            _plain_row(table, name.replace("_", " "), str(value))


def kafka_lag_line(held: Mapping[str, Any]) -> str:
    """``1,204 messages on 4 partitions (clicks/2 1,100, clicks/0 104)``: the total, then
    the partitions behind, the most behind first (three at most)."""
    total, partitions = int(held["kafka_lag_messages"]), int(held["kafka_partitions"])
    line = f"{total:,} messages on {partitions:,} partition{'' if partitions == 1 else 's'}"
    behind = sorted(
        ((int(lag), path) for path, lag in held.get("kafka_lag", {}).items() if lag),
        key=lambda pair: (-pair[0], pair[1]),
    )
    if behind:
        shown = ", ".join(f"{path} {lag:,}" for lag, path in behind[:3])
        more = f", {len(behind) - 3} more" if len(behind) > 3 else ""
        line += f" ({shown}{more})"
    unseen = int(held.get("kafka_partitions_unseen", 0))
    if unseen:
        line += f"; {unseen:,} not discovered yet (counted from where discovery starts them)"
    return line


def duration_words(seconds: float) -> str:
    """A duration as a person reads it: ``45s``, ``12m 05s``, ``5h 03m``, ``210d 08h`` (a
    lag of ``18,174,081s`` said nothing at a glance)."""
    whole = round(seconds)
    if whole < 100:
        return f"{whole}s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h {minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days:,}d {hours:02d}h"


def _watermark_line(live: LiveState) -> str:
    if live.watermark is None:
        return "none yet"
    if live.watermark >= END_OF_INPUT:
        return ENDED_WORDS
    lag = live.watermark_lag_seconds or 0
    if lag < 0:  # event times in the future (a producer's clock, or data dated ahead)
        return f"{live.watermark:%Y-%m-%d %H:%M:%S} ({duration_words(-lag)} ahead of this clock)"
    return f"{live.watermark:%Y-%m-%d %H:%M:%S} (lag {duration_words(lag)})"


def _backlog_line(live: LiveState) -> str:
    age = live.oldest_unprocessed_age_seconds
    oldest = "" if age is None else f", oldest waiting {duration_words(age)}"
    return f"{live.backlog_splits:,} splits{oldest}"


def status_json(
    statuses: list[PlatformStatus], held: Mapping[str, Mapping[str, Any]] | None = None
) -> dict[str, Any]:
    """``{"pipelines": {name: {...}}}`` with plain values (no connection details);
    ``held``: per pipeline, what its source holds on a server (``source``)."""
    out: dict[str, Any] = {}
    for status in statuses:
        last = status.last_checkpoint
        out[status.source] = {
            "source": dict((held or {}).get(status.source, {})),
            "splits": {state.value: status.splits.get(state, 0) for state in SplitStatus},
            "rows_committed": status.rows_committed,
            "rows_removed_by_steps": status.rows_dropped,
            "dead_letters": status.dead_letters,
            "dead_letter_reasons": dict(status.dead_letter_reasons),
            "failed_splits": [
                {
                    "id": split.id,
                    "uri": split.uri,
                    "failures": split.failures,
                    "reason": split.reason,
                    "last_error": split.last_error,
                    "failed_at": split.failed_at.isoformat() if split.failed_at else None,
                }
                for split in status.quarantined
            ],
            "last_commit_at": status.last_commit_at.isoformat() if status.last_commit_at else None,
            "live": status.live.to_json() if status.live is not None else None,
            "completions": None
            if status.completions is None
            else {
                "partitions": status.completions.partitions,
                "generations": status.completions.generations,
                "unreported": status.completions.unreported,
            },
            "last_checkpoint": None
            if last is None
            else {
                "run_id": last["run_id"],
                "checkpoint_id": last["checkpoint_id"],
                "status": last["status"],
                "triggered_at": last["triggered_at"].isoformat(),
                "completed_at": last["completed_at"].isoformat() if last["completed_at"] else None,
            },
        }
    return {"pipelines": out}
