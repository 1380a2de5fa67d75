"""``bench/e2e.py``: the lakehouse rows (``--skip iceberg``, ``delta``, ``compaction``).

- **Sluice into Iceberg, L = 0**: the clickstream example with its sink replaced by
  ``IcebergSink("<source>.clicks")`` — Sluice's own catalog in the platform database, the
  table under the run's warehouse folder, ``day(event_time)`` partitions, one snapshot per
  checkpoint. Each run gets a fresh namespace (the source's name: a namespace records its
  location, which is the run's warehouse folder, deleted after the run); after the run its
  files go with the warehouse folder and the table's and namespace's catalog entries are
  dropped, so no run finds a grown table. Its rate over the Parquet sink's L = 0 row of the
  same invocation: target >= 0.85x; its checkpoint p50 over the Parquet row's: target <= 2x
  (both the median of the interleaved rounds; the p50 is the run summary's
  ``checkpoint_p50_ms``, triggered -> completed in Postgres: the snapshot commit itself is the
  publish, after the completion transaction, so a slow commit shows in the rate, not there).
- **Sluice into Delta, L = 0**: the same with ``DeltaSink("clicks")`` (a table folder under
  the run's warehouse folder, ``dt`` partitions, one commit per checkpoint), deleted with it.
  Same 0.85x target as Iceberg (a verdict, not informational); its checkpoint p50 is shown.
- **Compaction of a day**: ``bench/iceberg_compaction.py``'s measurement (``measure``) —
  ``compact_day`` against a bare PyIceberg ``scan(day).to_arrow()`` + ``overwrite(day)`` of an
  identical table whose day holds many small files; rate = the day's rows / median wall s of
  ``--rounds`` rounds; target >= 0.5x the bare rate. It runs after the rounds, in this process.

After each run, untimed, the table's current snapshot / version must hold exactly the run's
output rows (data files' record counts / add actions' ``num_records`` against the summary's
``rows_out``), else the bench stops: a sink that committed nothing is not measured as fast.
Both runs are in the interleaved rounds with a warm-up of their own (their labels do not
start with "Sluice"), so that neither pays the other's or the Parquet run's start-up.
"""

from __future__ import annotations

import contextlib
import functools
import uuid
from collections.abc import Callable
from typing import Any

import pyarrow as pa
from _e2e_common import (
    TARGET_CHECKPOINT_VS_PARQUET,
    TARGET_COMPACTION_VS_BARE,
    TARGET_LAKEHOUSE_VS_PARQUET,
    Context,
    Result,
    console,
)
from _e2e_sluice import run_sluice
from _harness import verdict_line

from enumerator_service import Settings

ICEBERG_LABEL = "Sluice into Iceberg (IcebergSink, Sluice's catalog)"
DELTA_LABEL = "Sluice into Delta (DeltaSink)"
TABLE = "clicks"
COMPACTION_ROWS = 500  # rows per small file of the compacted day
COMPACTION_FILES, COMPACTION_FILES_QUICK = 200, 50  # small files of the day


def run_iceberg(ctx: Context) -> Result:
    """One clickstream run at L = 0 into a fresh Iceberg table; its catalog entries dropped
    after it (its files go with the run's warehouse folder)."""
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    from spark_jobs import IcebergSink
    from spark_jobs.connectors.iceberg._catalog import open_catalog

    source = f"bench_e2e_{uuid.uuid4().hex[:10]}"
    try:
        return run_sluice(
            ctx,
            0.0,
            label=ICEBERG_LABEL,
            kind="iceberg",
            sink=IcebergSink(f"{source}.{TABLE}"),
            source=source,
            verify=functools.partial(_verify_iceberg, ctx, f"{source}.{TABLE}"),
        )
    finally:
        # Only catalog rows (drop_table does not read the already deleted metadata; a run
        # that failed before creating them has none).
        catalog = open_catalog(ctx.platform.engine, None, None)
        with contextlib.suppress(NoSuchTableError):
            catalog.drop_table(f"{source}.{TABLE}")
        with contextlib.suppress(NoSuchNamespaceError):
            catalog.drop_namespace(source)


def run_delta(ctx: Context) -> Result:
    """One clickstream run at L = 0 into a fresh Delta table under the run's warehouse folder
    (deleted with it)."""
    from spark_jobs import DeltaSink

    return run_sluice(
        ctx, 0.0, label=DELTA_LABEL, kind="delta", sink=DeltaSink(TABLE), verify=_verify_delta
    )


def _check_rows(what: str, table_rows: int, summary: Any) -> None:
    """A run whose table does not hold exactly its output rows measured nothing: raise."""
    if table_rows != summary.rows_out:
        raise AssertionError(
            f"{what}: {table_rows:,} rows in the table, run wrote {summary.rows_out:,}"
        )


def _verify_iceberg(ctx: Context, identifier: str, _settings: Settings, summary: Any) -> None:
    """The table's current snapshot holds the run's output rows (data files' record counts)."""
    from spark_jobs.connectors.iceberg._catalog import open_catalog

    table = open_catalog(ctx.platform.engine, None, None).load_table(identifier)
    rows = sum(task.file.record_count for task in table.scan().plan_files())
    _check_rows(f"Iceberg {identifier}", rows, summary)


def _verify_delta(settings: Settings, summary: Any) -> None:
    """The Delta table's current version holds the run's output rows (add actions' counts)."""
    from deltalake import DeltaTable

    from spark_jobs.connectors.delta._paths import table_uri
    from spark_jobs.pipeline._paths import warehouse_root

    path = table_uri(warehouse_root(settings).child(TABLE))  # DeltaSink(TABLE) is relative
    actions = DeltaTable(path).get_add_actions(flatten=True)
    rows = sum(pa.table(actions).column("num_records").to_pylist())
    _check_rows(f"Delta {path}", rows, summary)


def lakehouse_plans(ctx: Context, skip: set[str]) -> list[tuple[str, Callable[[], Result]]]:
    """(label, run) of the Iceberg and Delta rows not in ``skip``."""
    plans: list[tuple[str, Callable[[], Result]]] = []
    if "iceberg" not in skip:
        plans.append(("iceberg: Sluice into Iceberg, L=0 ms", lambda: run_iceberg(ctx)))
    if "delta" not in skip:
        plans.append(("delta: Sluice into Delta, L=0 ms", lambda: run_delta(ctx)))
    return plans


def run_compaction(ctx: Context) -> list[Result]:
    """The bare rewrite's and compaction's rows (rows of the day / median wall s)."""
    from iceberg_compaction import measure

    files = COMPACTION_FILES_QUICK if ctx.args.quick else COMPACTION_FILES
    rounds = ctx.args.rounds
    with console.status(f"Iceberg compaction of a day of {files} files vs a bare rewrite…"):
        m = measure(ctx.platform.engine, files, COMPACTION_ROWS, rounds, report=False)
    note = (
        f"median of {rounds} round(s); a day of {files} files x {COMPACTION_ROWS} rows "
        "(+ another day), SQL catalog on the platform database; in this process"
    )
    found = [
        Result(
            None,
            "compaction-bare",
            "bare PyIceberg scan(day).to_arrow() + overwrite(day)",
            m.rows,
            m.bare_median,
            m.rows / m.bare_median,
            note=f"{note}; rounds {' / '.join(f'{s:.2f}' for s in m.bare)} s",
        ),
        Result(
            None,
            "compaction",
            "Sluice compact_day (Iceberg, table lock, one snapshot)",
            m.rows,
            m.compaction_median,
            m.rows / m.compaction_median,
            note=f"{note}; rounds {' / '.join(f'{s:.2f}' for s in m.compaction)} s",
        ),
    ]
    for r in found:
        console.print(f"{r.variant}: {r.rate:,.0f} rows/s, {r.seconds:.2f} s; {r.note}")
    return found


def _find(results: list[Result], kind: str, latency: float | None) -> Result | None:
    return next((r for r in results if r.kind == kind and r.latency_ms == latency), None)


def _p50(r: Result) -> str:
    return "-" if r.checkpoint_p50_ms is None else f"{r.checkpoint_p50_ms:.0f} ms"


def _sink_verdicts(results: list[Result], kind: str, name: str) -> list[str]:
    parquet, sink = _find(results, "sluice", 0.0), _find(results, kind, 0.0)
    if not (parquet and sink):
        return [verdict_line(None, f"L=0: Sluice into {name} vs the Parquet sink (not measured)")]
    ratio = sink.rate / parquet.rate
    lines = [
        verdict_line(
            ratio >= TARGET_LAKEHOUSE_VS_PARQUET,
            f"L=0: Sluice into {name} {sink.rate:,.0f} events/s = {ratio:.2f}x the Parquet "
            f"sink's {parquet.rate:,.0f} events/s (target >= {TARGET_LAKEHOUSE_VS_PARQUET:g}x; "
            f"medians of this invocation); checkpoint p50 {_p50(sink)} vs {_p50(parquet)}",
        )
    ]
    if kind == "iceberg":
        if sink.checkpoint_p50_ms is None or not parquet.checkpoint_p50_ms:
            lines.append(verdict_line(None, "checkpoint p50, Iceberg vs Parquet (no p50)"))
        else:
            p50_ratio = sink.checkpoint_p50_ms / parquet.checkpoint_p50_ms
            lines.append(
                verdict_line(
                    p50_ratio <= TARGET_CHECKPOINT_VS_PARQUET,
                    f"L=0: checkpoint p50 into Iceberg {_p50(sink)} = {p50_ratio:.2f}x the "
                    f"Parquet sink's {_p50(parquet)} (target <= "
                    f"{TARGET_CHECKPOINT_VS_PARQUET:g}x; triggered -> completed, medians of "
                    "the rounds)",
                )
            )
    return lines


def lakehouse_verdicts(results: list[Result]) -> list[str]:
    """Verdict lines: Iceberg rate and checkpoint p50, Delta rate, compaction."""
    lines = [
        *_sink_verdicts(results, "iceberg", "Iceberg"),
        *_sink_verdicts(results, "delta", "Delta"),
    ]
    bare, compaction = _find(results, "compaction-bare", None), _find(results, "compaction", None)
    if bare and compaction:
        ratio = compaction.rate / bare.rate
        lines.append(
            verdict_line(
                ratio >= TARGET_COMPACTION_VS_BARE,
                f"compaction of a day ({compaction.events:,} rows): {compaction.rate:,.0f} "
                f"rows/s = {ratio:.2f}x a bare PyIceberg read + overwrite's {bare.rate:,.0f} "
                f"(target >= {TARGET_COMPACTION_VS_BARE:g}x; medians of this invocation)",
            )
        )
    else:
        lines.append(verdict_line(None, "Iceberg compaction vs a bare rewrite (not measured)"))
    return lines
