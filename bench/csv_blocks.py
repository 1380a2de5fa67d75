"""CSV block parsing: µs per line of the exact per-line path against ``CsvLinesParser.parse``
(the column-wise fast path, ``spark_jobs/source/_csv_blocks.py``) on the same block.

    python bench/csv_blocks.py [--lines 2000] [--repeat 7]

A block of ``--lines`` orders-like CSV lines (string, int64, decimal(12,2), UTC timestamp,
an optional string, an undeclared column), parsed two ways, interleaved, ``--repeat`` times:
clean, and with one malformed line in the middle (a decimal with too many digits: a dead
letter). Prints the medians and their ratio. Single-threaded, no database, no Spark.
"""

from __future__ import annotations

import argparse
import statistics
import time

import pyarrow as pa

from spark_jobs.source import CsvLinesParser, RecordConverter, RecordSchema

SCHEMA = RecordSchema(
    (
        pa.field("order_id", pa.string()),
        pa.field("tenant_id", pa.int64()),
        pa.field("customer_id", pa.int64()),
        pa.field("currency", pa.string()),
        pa.field("amount", pa.decimal128(12, 2)),
        pa.field("ordered_at", pa.timestamp("us", tz="UTC")),
        pa.field("note", pa.string()),
    ),
    required=("order_id", "tenant_id", "customer_id", "currency", "amount", "ordered_at"),
)
HEADER = ["order_id", "tenant_id", "customer_id", "currency", "amount", "ordered_at", "note", "x"]


def line(i: int) -> bytes:
    note = "" if i % 4 else f"note {i}"
    return (
        f"o-{i:09d},{i % 5},{i % 100_000},{('EUR', 'USD', 'GBP')[i % 3]},{i % 9999}.{i % 100:02d},"
        f"2026-01-{1 + i % 28:02d}T{i % 24:02d}:{i % 60:02d}:{i % 60:02d}Z,{note},extra"
    ).encode()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    csv = CsvLinesParser(RecordConverter(SCHEMA), HEADER, 1 << 16)
    lines = [line(i) for i in range(args.lines)]
    bad, half = line(0).replace(b",0.00,", b",1.001,"), args.lines // 2
    blocks = {"clean": lines, "one bad line": [*lines[:half], bad, *lines[half:]]}
    for name, block in blocks.items():
        data = b"\n".join(block) + b"\n"
        seconds: dict[str, list[float]] = {"exact": [], "fast": []}
        for _ in range(args.repeat):
            for path, parse in (("exact", csv.parse_exact), ("fast", csv.parse)):
                start = time.perf_counter()
                parse(data, 100)
                seconds[path].append(time.perf_counter() - start)
        exact, fast = (statistics.median(seconds[p]) / len(block) * 1e6 for p in seconds)
        print(
            f"{name:13} {len(data) // 1024} KiB, {len(block)} lines: exact {exact:.2f} µs/line,"
            f" fast path {fast:.2f} µs/line ({exact / fast:.1f}x)"
        )


if __name__ == "__main__":
    main()
