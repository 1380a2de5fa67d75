"""The documentation's code blocks run: every page under ``docs/`` (except the generated
reference) and ``README.md``, one test per page (the test id is the page's path).

The contract, in page order:

1. ```` ```python title="path/to/file.py" ```` — written to that path, relative to the page's
   current directory (a fresh per-page sandbox, unless a shell block ``cd``'d elsewhere),
   which is the cwd of Python blocks and on ``sys.path``.
2. ```` ```python ```` (no title) — executed in one namespace per page (``__name__`` is
   ``"__main__"``), cwd = the page's current directory, ``os.environ`` = the page's
   environment. Tracebacks name the page and its line numbers.
3. ```` ```bash ```` — on a page with the line ``<!-- docs-test: shell -->``, each block runs
   with ``bash -euo pipefail`` in the page's current directory, ``SLUICE_HOME`` in the sandbox
   and the venv's bin first on PATH. On other pages every line starting with ``sluice `` (after
   optional ``VAR=value`` words) is parsed by the click CLI — the command and its options must
   exist — and nothing is run.
4. ``<!-- docs-test: skip: <reason> -->`` on the line before a block: not run.
5. Other fences (``text``, ``sql``, ``toml``, ``yaml``, ``console``, ``mermaid``) are not run.

Extensions (shell pages):

- One terminal session per page: the variables a block ``export``s and the directory it
  ``cd``'s into carry over to the next blocks (and to the page's Python blocks and titled
  files). Plain (unexported) shell variables do not.
- The sandbox holds ``sluice/``: a checkout of this repository (links to its files and its
  venv, no ``.sluice`` or ``data``), which is what ``git clone`` would give (a page's clone
  command itself is skipped). ``make`` there never reinstalls the venv (its install stamp is fresh:
  an install from the sandbox would repoint the shared venv's editable install);
  sample data sizes are small (``docs_runner.DEMO_SIZES``); landing files need
  no settle time (``SLUICE_FILE_SETTLE_SECONDS=0``).
- ``<!-- docs-test: background -->`` before a bash block: the block is started in the
  background (its own session) and the page goes on once something listens on
  ``127.0.0.1:$SLUICE_DOCS_PORT`` — a free port the harness picks; it also sets
  ``DAGSTER_CLI_DEV_PORT`` to it, so ``dagster dev`` without ``-p`` listens there (3000 for a
  reader). When the page ends the process and every descendant are stopped (SIGTERM, then
  SIGKILL after 5 s), and so is the embedded Postgres of the page's ``SLUICE_HOME``.
- ``<!-- docs-test: expect -->`` before a ``text`` block: each non-blank line of it must appear,
  in order, in the output of the block run just before (runs of white space match any white
  space; ``...`` or ``…`` matches anything). This is how a page's shown output is kept true.
- ``<!-- docs-test: check: <name> -->`` (on a line of its own): runs ``docs_checks.CHECKS[name]``
  at that point — what a reader does by clicking in a UI, driven by the test, and assertions
  on the outcome.

Set ``SLUICE_DOCS_KEEP=1`` to keep the sandboxes for a look after a failure.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from docs_blocks import read_page
from docs_checks import CHECKS
from docs_runner import run_page
from docs_sandbox import REPO

#: dagster 1.13 warns about its own ``owners`` parameter when a ``Definitions`` object attaches
#: resources to its sensors (``defs().resolve_*``); the sensors set no owners. (Here, not in a
#: conftest.py of tests/docs: a second module named ``conftest`` shadows tests/conftest.py for
#: the suites that import from it.)
pytestmark = pytest.mark.filterwarnings(
    "ignore:Parameter `owners` of initializer `SensorDefinition.__init__`:"
    "dagster_shared.utils.warnings.BetaWarning"
)


def _pages() -> list[Path]:
    docs = REPO / "docs"
    pages = [REPO / "README.md"]
    if docs.is_dir():
        pages += sorted(
            path for path in docs.rglob("*.md") if "reference" not in path.relative_to(docs).parts
        )
    return [page for page in pages if page.is_file()]


def _params() -> list[object]:
    params: list[object] = []
    for path in _pages():
        text = path.read_text(encoding="utf-8")
        marks = []
        if "<!-- docs-test: shell -->" in text:  # real commands: Spark, Postgres
            marks += [pytest.mark.spark, pytest.mark.timeout(900)]
        if "<!-- docs-test: background -->" in text:  # the tutorial's dagster dev
            marks.append(pytest.mark.ui)
        params.append(pytest.param(path, id=str(path.relative_to(REPO)), marks=marks))
    return params


@pytest.mark.parametrize("path", _params())
def test_doc_blocks(path: Path) -> None:
    page = read_page(path, REPO)
    started = time.monotonic()
    run = run_page(page, CHECKS)
    if page.shell:  # where the time goes (pytest -s shows it)
        print(f"\n{page.path}: {time.monotonic() - started:.1f} s")
        for line, what, seconds in run.timings:
            if seconds >= 0.5:
                print(f"  line {line:4d}  {what:<24} {seconds:6.1f} s")
