"""JSON Lines block parsing: µs per line of the fast path on one read block.

    python bench/json_blocks.py [--repeat 15] [--block-bytes 262144]

Parses one block (``--block-bytes`` of whole lines, the reader's default: ~1,900 lines) of the
clickstream example's sample events (``examples/_clickstream_data.py``) with
``JsonLinesParser`` under the schema ``examples/clickstream.py`` declares (string, int64,
timestamp, string, float64; all required), three ways:

- the demo block as generated (about one malformed line in a thousand: halving and the exact
  path for those lines included);
- the same block without its malformed lines (the pure fast path);
- the clean block with three undeclared fields per line (the fields are ignored).

Prints the best and the median of ``--repeat`` runs of 50 parses each. Single-threaded, no
database, no Spark.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from datetime import date
from pathlib import Path

import orjson
import pyarrow as pa

from examples._clickstream_data import DemoSpec, generate_events
from spark_jobs.source import JsonLinesParser, RecordSchema

CLICKSTREAM = RecordSchema(
    (
        pa.field("event_id", pa.string()),
        pa.field("user_id", pa.int64()),
        pa.field("event_time", pa.timestamp("us", tz="UTC")),
        pa.field("event_type", pa.string()),
        pa.field("amount", pa.float64()),
    ),
    frozenset({"event_id", "user_id", "event_time", "event_type", "amount"}),
    "event_time",
)


def blocks(block_bytes: int) -> list[tuple[str, bytes]]:
    with tempfile.TemporaryDirectory() as folder:
        spec = DemoSpec(20_000, 1, 1, 1000, date(2026, 1, 1), seed=7)
        generate_events(Path(folder), spec)
        data = next(Path(folder).rglob("*.jsonl")).read_bytes()
    demo = data[: data.rfind(b"\n", 0, block_bytes) + 1]
    _, dead = JsonLinesParser(CLICKSTREAM, 1 << 20).parse(demo, 0)
    malformed = {offset for offset, _, _ in dead}
    lines, at = [], 0
    for line in demo.split(b"\n")[:-1]:
        if at not in malformed:
            lines.append(line)
        at += len(line) + 1
    extra = [
        orjson.dumps({**orjson.loads(line), "session": "s-1", "ua": "Mozilla/5.0", "n": [1, 2]})
        for line in lines
    ]
    return [
        (f"demo block ({len(dead)} malformed)", demo),
        ("without malformed lines", b"\n".join(lines) + b"\n"),
        ("with 3 undeclared fields", b"\n".join(extra) + b"\n"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--block-bytes", type=int, default=256 << 10)
    args = parser.parse_args()
    for name, block in blocks(args.block_bytes):
        lines = block.count(b"\n")
        json = JsonLinesParser(CLICKSTREAM, 1 << 20)
        for _ in range(10):  # warm up
            json.parse(block, 0)
        runs = []
        for _ in range(args.repeat):
            started = time.perf_counter()
            for _ in range(50):
                json.parse(block, 0)
            runs.append((time.perf_counter() - started) / 50 / lines * 1e6)
        print(
            f"{name:28s} {lines} lines, {len(block)} bytes: "
            f"best {min(runs):.3f} µs/line, median {statistics.median(runs):.3f} µs/line"
        )


if __name__ == "__main__":
    main()
