"""The docs harness itself: the block parser, the ``sluice`` line parser, output matching."""

from __future__ import annotations

import pytest
from docs_blocks import Block, Check, DocParseError, parse_page, sluice_commands
from docs_matching import expect_matches, parse_cli

PAGE = """\
# A page

<!-- docs-test: shell -->

```python title="pkg/my_module.py"
X = 1
```

Some text.

```python
import pkg.my_module
```

<!-- docs-test: skip: needs a real S3 bucket -->
```bash
aws s3 ls
```

    ```bash
    echo indented
    ```

<!-- docs-test: check: backfill -->

<!-- docs-test: expect -->
````text
rows: 3
````

```sql
select 1;
```
"""


def test_blocks_in_page_order_with_titles_skips_and_checks() -> None:
    page = parse_page(PAGE, "docs/x.md")
    assert page.shell
    kinds = [
        (item.kind, item.line) if isinstance(item, Block) else ("check", item.name)
        for item in page.items
    ]
    assert kinds == [
        ("python-file", 5),
        ("python", 11),
        ("bash", 16),
        ("bash", 20),
        ("check", "backfill"),
        ("other", 27),
        ("other", 31),
    ]
    blocks = page.blocks
    assert blocks[0].title == "pkg/my_module.py"
    assert blocks[0].code == "X = 1\n"
    assert blocks[2].skip == "needs a real S3 bucket"
    assert blocks[3].code == "echo indented\n"  # the fence's indentation is removed
    assert blocks[4].expect and blocks[4].code == "rows: 3\n"
    assert isinstance(page.items[4], Check) and page.items[4].line == 24


def test_a_page_without_the_shell_line_is_not_a_shell_page() -> None:
    assert not parse_page("```bash\nsluice run\n```\n").shell


@pytest.mark.parametrize(
    "text",
    [
        "<!-- docs-test: skip -->\n```bash\nx\n```\n",  # a skip without a reason
        "<!-- docs-test: skipp: typo -->\n```bash\nx\n```\n",  # unknown directive
        "<!-- docs-test: skip: why -->\nsome text\n```bash\nx\n```\n",  # not before a block
        "```python\nx = 1\n",  # never closed
        "<!-- docs-test: background -->\n```python\nx = 1\n```\n",
        "<!-- docs-test: expect -->\n```bash\nx\n```\n",
        "<!-- docs-test: skip: at the end -->\n",
    ],
)
def test_contract_mistakes_are_errors(text: str) -> None:
    with pytest.raises(DocParseError):
        parse_page(text, "docs/bad.md")


def test_sluice_lines_of_a_bash_block() -> None:
    code = (
        "# a comment\n"
        "sluice run shipments --date 2026-03-01 \\\n"
        "    --replace   # rebuild\n"
        "SLUICE_PIPELINES=shipments sluice pipelines | head\n"
        'psql "$(sluice db url)"\n'
        "sluice status --json > status.json\n"
    )
    assert sluice_commands(code) == [
        (1, ["run", "shipments", "--date", "2026-03-01", "--replace"]),
        (3, ["pipelines"]),
        (5, ["status", "--json"]),
    ]


def test_cli_lines_are_parsed_not_run() -> None:
    from spark_jobs.cli import cli

    assert parse_cli(cli, ["run", "orders", "--date", "2026-01-02", "--replace"]) is None
    assert parse_cli(cli, ["status", "--json"]) is None
    assert parse_cli(cli, ["db", "upgrade"]) is None
    assert parse_cli(cli, ["run", "--help"]) is None
    assert "No such option" in (parse_cli(cli, ["run", "--replce"]) or "")
    assert "No such command" in (parse_cli(cli, ["runn"]) or "")
    assert "No such command" in (parse_cli(cli, ["db", "upgrad"]) or "")


def test_expected_output_matches_in_order_with_wildcards() -> None:
    output = "Splits   3 done\nrows in  1,204   rows out 1,198\ntook 4.2 s\n"
    assert expect_matches("rows in 1,204 rows out 1,198", output) is None
    assert expect_matches("Splits 3 done\ntook ... s", output) is None
    assert expect_matches("took … s\nSplits 3", output) == "Splits 3"  # order matters
    assert expect_matches("rows in 1,205", output) == "rows in 1,205"
