"""Runs one documentation page's blocks under the contract of ``test_doc_blocks`` (see its
docstring); the parser is ``docs_blocks``, the page-specific checks ``docs_checks``."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil  # type: ignore[import-untyped]
from docs_blocks import Block, Check, Page, sluice_commands
from docs_matching import expect_matches, parse_cli
from docs_sandbox import VENV_BIN, make_checkout, page_env

#: A shell block that takes longer fails (the whole tutorial must stay far below this).
BLOCK_TIMEOUT = 300.0
#: How long background processes get to end after SIGTERM before they are SIGKILLed.
STOP_GRACE = 5.0
#: How long a background block may take to listen on its port.
SERVE_TIMEOUT = 120.0


class DocBlockFailure(AssertionError):
    """A block of a page failed: the message names the page, the line and the error."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _tail(text: str, lines: int = 60) -> str:
    kept = text.splitlines()[-lines:]
    return "\n".join("    " + line for line in kept)


@dataclass
class PageRun:
    """The state of one page being run: one terminal session and one Python namespace."""

    page: Page
    sandbox: Path
    env: dict[str, str]
    cwd: Path
    port: int
    namespace: dict[str, object] = field(default_factory=dict)
    #: Output (stdout and stderr) of the block run last.
    last_output: str = ""
    #: Output of every bash block run so far, by the line of its fence.
    outputs: dict[int, str] = field(default_factory=dict)
    background: list[tuple[Block, subprocess.Popen[bytes], Path]] = field(default_factory=list)
    #: (line, what, seconds) of every item run, for the test's report.
    timings: list[tuple[int, str, float]] = field(default_factory=list)

    def fail(self, line: int, what: str, detail: str) -> DocBlockFailure:
        return DocBlockFailure(f"{self.page.path}:{line}: {what}\n{detail}")

    def shell(self, command: str, timeout: float = 120.0) -> str:
        """Run a command in the page's terminal session (for checks); its output."""
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", command],
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise AssertionError(
                f"{command!r} exited {done.returncode}\n{_tail(done.stdout + done.stderr)}"
            )
        return done.stdout


@contextlib.contextmanager
def _in_process(run: PageRun) -> Iterator[None]:
    """os.environ, the cwd and sys.path of the page while a Python block runs."""
    saved_env = dict(os.environ)
    saved_cwd = Path.cwd()
    saved_path = list(sys.path)
    os.environ.clear()
    os.environ.update(run.env)
    os.chdir(run.cwd)
    sys.path.insert(0, str(run.cwd))
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        os.chdir(saved_cwd)
        sys.path[:] = saved_path


def _forget_modules(root: Path) -> None:
    """Drop the modules imported from ``root`` (a later page may write the same names)."""
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if file and Path(file).resolve().is_relative_to(root.resolve()):
            del sys.modules[name]


def run_python(run: PageRun, block: Block) -> None:
    # Line numbers of tracebacks are the page's: the code is compiled at its place.
    source = "\n" * (block.first_code_line - 1) + block.code
    try:
        code = compile(source, run.page.path, "exec")
    except SyntaxError as exc:
        raise run.fail(block.line, "python block does not compile", f"    {exc}") from None
    out = io.StringIO()
    with _in_process(run), contextlib.redirect_stdout(out):
        try:
            exec(code, run.namespace)  # noqa: S102 - running the docs' code is the point
        except Exception as exc:
            tb = exc.__traceback__
            frames = traceback.format_exception(type(exc), exc, tb.tb_next if tb else None)
            raise run.fail(
                block.line, f"python block failed: {type(exc).__name__}: {exc}", "".join(frames)
            ) from None
    run.last_output = out.getvalue()


def write_file(run: PageRun, block: Block) -> None:
    assert block.title is not None
    target = run.cwd / block.title
    if not target.resolve().is_relative_to(run.sandbox.resolve()):
        raise run.fail(block.line, f"title {block.title!r} leads out of the sandbox", "")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(block.code, encoding="utf-8")
    module = block.title.removesuffix(".py").replace("/", ".")
    sys.modules.pop(module, None)  # rewritten: imported afresh


def _trap(state: Path) -> str:
    """Bash preamble: on exit, save the exported variables and the cwd for the next block."""
    return f"trap '__rc=$?; env -0 > {state}/env; pwd > {state}/cwd; exit $__rc' EXIT\n"


def _load_state(run: PageRun, state: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        raw = (state / "env").read_bytes().decode("utf-8", "replace")
        env = {}
        for entry in raw.split("\0"):
            key, sep, value = entry.partition("=")
            if sep and key not in ("PWD", "OLDPWD", "SHLVL", "_"):
                env[key] = value
        run.env = env
    with contextlib.suppress(FileNotFoundError):
        run.cwd = Path((state / "cwd").read_text().strip())


def run_bash(run: PageRun, block: Block) -> None:
    state = Path(tempfile.mkdtemp(prefix="state-", dir=run.sandbox))
    script = _trap(state) + block.code
    if block.background:
        log = state / "background.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                ["bash", "-euo", "pipefail", "-c", block.code],
                cwd=run.cwd,
                env=run.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        run.background.append((block, process, log))
        _wait_serving(run, block, process, log)
        return
    try:
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=run.cwd,
            env=run.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=BLOCK_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        output = (exc.stdout or b"").decode("utf-8", "replace")
        raise run.fail(
            block.line, f"bash block timed out after {BLOCK_TIMEOUT:.0f} s", _tail(output)
        ) from None
    output = done.stdout.decode("utf-8", "replace")
    run.last_output = output
    run.outputs[block.line] = output
    if done.returncode != 0:
        raise run.fail(block.line, f"bash block exited {done.returncode}", _tail(output))
    _load_state(run, state)


def _wait_serving(run: PageRun, block: Block, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + SERVE_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise run.fail(
                block.line,
                f"background block exited {process.returncode} before serving",
                _tail(log.read_text(errors="replace")),
            )
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", run.port), 1):
            return
        time.sleep(0.5)
    raise run.fail(
        block.line,
        f"background block not serving on 127.0.0.1:{run.port} after {SERVE_TIMEOUT:.0f} s",
        _tail(log.read_text(errors="replace")),
    )


def stop_background(run: PageRun) -> None:
    """SIGTERM every background process and each of its descendants, then SIGKILL what is
    left after a few seconds (a run worker, its Spark JVM)."""
    for _, process, _ in run.background:
        try:
            procs = [psutil.Process(process.pid)]
            procs += procs[0].children(recursive=True)
        except psutil.NoSuchProcess:
            procs = []
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGTERM)
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.terminate()
        _, alive = psutil.wait_procs(procs, timeout=STOP_GRACE)
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)


def check_sluice_commands(run: PageRun, block: Block) -> None:
    """Each ``sluice ...`` line of the block is parsed by the CLI (not run)."""
    from spark_jobs.cli import cli

    for offset, args in sluice_commands(block.code):
        error = parse_cli(cli, args)
        if error:
            raise run.fail(
                block.first_code_line + offset, f"`sluice {' '.join(args)}`: {error}", ""
            )


def check_expect(run: PageRun, block: Block) -> None:
    missing = expect_matches(block.code, run.last_output)
    if missing is not None:
        raise run.fail(
            block.line,
            f"the page shows {missing.strip()!r}, which the output of the block before does "
            "not have:",
            _tail(run.last_output, 80),
        )


@contextlib.contextmanager
def page_run(page: Page) -> Iterator[PageRun]:
    """A sandbox for one page (a short path under the temp folder: the embedded Postgres's
    Unix socket path must stay under ~100 bytes), removed afterwards with everything the
    page started (background processes, the embedded server of its SLUICE_HOME)."""
    sandbox = Path(tempfile.mkdtemp(prefix="sd-")).resolve()
    port = _free_port()
    run = PageRun(page=page, sandbox=sandbox, env=page_env(sandbox, port), cwd=sandbox, port=port)
    run.namespace = {"__name__": "__main__"}
    if page.shell:
        make_checkout(sandbox)
    spark_before = _spark_gateway()
    try:
        yield run
    finally:
        stop_background(run)
        _stop_spark_started_since(spark_before)
        if (sandbox / ".sluice" / "pg").exists():
            subprocess.run(
                [str(VENV_BIN / "sluice"), "db", "stop"],
                env={**run.env, "SLUICE_HOME": str(sandbox / ".sluice")},
                cwd=sandbox,
                capture_output=True,
                timeout=60,
                check=False,
            )
        _forget_modules(sandbox)
        if not os.environ.get("SLUICE_DOCS_KEEP"):
            shutil.rmtree(sandbox, ignore_errors=True)


def _spark_gateway() -> object | None:
    from pyspark import SparkContext

    return SparkContext._gateway


def _stop_spark_started_since(before: object | None) -> None:
    """Stop the Spark JVM a Python block of the page launched in this process (a session
    built while the block ran): the JVM was started in the page's sandbox (the block's cwd
    and environment), and every Python worker it forks starts there — in a folder that is
    gone once the page ends, for the next test that takes the same JVM. A stopped session
    alone keeps the JVM (pyspark reuses its gateway): the gateway is shut down too."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    gateway = SparkContext._gateway
    if gateway is None or gateway is before:
        return
    session = SparkSession.getActiveSession()
    if session is not None:
        session.stop()
    elif SparkContext._active_spark_context is not None:
        SparkContext._active_spark_context.stop()
    gateway.shutdown()
    proc = getattr(gateway, "proc", None)
    if proc is not None:  # the JVM ends when its stdin closes (PythonGatewayServer)
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    SparkContext._gateway = None
    SparkContext._jvm = None


Checks = dict[str, Callable[[PageRun], None]]


def run_page(page: Page, checks: Checks) -> PageRun:
    """Run every item of the page in order (raises DocBlockFailure on the first failure)."""
    with page_run(page) as run:
        for item in page.items:
            started = time.monotonic()
            _run_item(run, item, checks)
            what = f"check {item.name}" if isinstance(item, Check) else item.kind
            run.timings.append((item.line, what, time.monotonic() - started))
        return run


def _run_item(run: PageRun, item: Block | Check, checks: Checks) -> None:
    if isinstance(item, Check):
        check = checks.get(item.name)
        if check is None:
            raise run.fail(item.line, f"no check named {item.name!r} in docs_checks", "")
        try:
            check(run)
        except AssertionError as exc:
            raise run.fail(item.line, f"check {item.name} failed", str(exc)) from None
        return
    if item.skip is not None:
        return
    if item.expect:
        check_expect(run, item)
    elif item.kind == "python-file":
        write_file(run, item)
    elif item.kind == "python":
        run_python(run, item)
    elif item.kind == "bash":
        if run.page.shell:
            run_bash(run, item)
        else:
            check_sluice_commands(run, item)
