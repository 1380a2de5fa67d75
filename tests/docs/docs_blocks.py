"""The parser of the documentation's code blocks (no execution here: ``docs_runner``).

A page is a list of items in page order: fenced code blocks (with the directives written on
the line before them) and ``check`` directives. Directives are HTML comments, invisible in the
built site::

    <!-- docs-test: shell -->            the page's bash blocks run for real (page-level)
    <!-- docs-test: skip: <reason> -->   the next block is not run (a reason is required)
    <!-- docs-test: background -->       the next bash block is started in the background
    <!-- docs-test: expect -->           the next text block must match the output of the
                                         block run just before it
    <!-- docs-test: check: <name> -->    run the check ``<name>`` of ``docs_checks`` here

A directive that attaches to a block (skip, background, expect) must be the last non-blank
line before the block's opening fence. An unknown directive is an error, not ignored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "Block",
    "Check",
    "DocParseError",
    "Page",
    "parse_page",
    "sluice_commands",
]

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
_DIRECTIVE = re.compile(r"^\s*<!--\s*docs-test:\s*(?P<body>.*?)\s*-->\s*$")
_TITLE = re.compile(r"""\btitle=(?:"(?P<dq>[^"]*)"|'(?P<sq>[^']*)'|(?P<bare>\S+))""")

#: Fence languages that are never run.
NOT_RUN = frozenset({"text", "sql", "toml", "yaml", "yml", "console", "mermaid", "json", "ini"})


class DocParseError(Exception):
    """A page's markup breaks the contract (an unclosed fence, a bad directive)."""


@dataclass(frozen=True)
class Block:
    """One fenced code block."""

    lang: str
    code: str
    line: int  # 1-based line of the opening fence
    title: str | None = None
    skip: str | None = None
    background: bool = False
    expect: bool = False

    @property
    def first_code_line(self) -> int:
        return self.line + 1

    @property
    def kind(self) -> str:
        """``python-file``, ``python``, ``bash`` or ``other``."""
        if self.lang == "python":
            return "python-file" if self.title else "python"
        if self.lang in ("bash", "sh", "shell"):
            return "bash"
        return "other"


@dataclass(frozen=True)
class Check:
    """A ``check`` directive: a named check of ``docs_checks`` runs at this point."""

    name: str
    line: int


@dataclass
class Page:
    path: str
    shell: bool = False
    items: list[Block | Check] = field(default_factory=list)

    @property
    def blocks(self) -> list[Block]:
        return [item for item in self.items if isinstance(item, Block)]


def parse_page(text: str, path: str = "<page>") -> Page:
    """The blocks and checks of a markdown page, in page order."""
    page = Page(path=path)
    lines = text.splitlines()
    pending: list[tuple[int, str]] = []  # directives waiting for the next block
    i = 0
    while i < len(lines):
        line = lines[i]
        number = i + 1
        directive = _DIRECTIVE.match(line)
        if directive:
            body = directive.group("body")
            name, _, arg = body.partition(":")
            name, arg = name.strip(), arg.strip()
            if name == "shell" and not arg:
                page.shell = True
            elif name == "check":
                if not arg:
                    raise DocParseError(f"{path}:{number}: 'check' needs a name")
                page.items.append(Check(arg, number))
            elif name == "skip":
                if not arg:
                    raise DocParseError(f"{path}:{number}: 'skip' needs a reason: skip: <reason>")
                pending.append((number, body))
            elif name in ("background", "expect") and not arg:
                pending.append((number, name))
            else:
                raise DocParseError(f"{path}:{number}: unknown docs-test directive {body!r}")
            i += 1
            continue
        fence = _FENCE.match(line)
        if fence is None:
            if line.strip() and pending:
                raise DocParseError(
                    f"{path}:{pending[0][0]}: a docs-test directive must come right "
                    "before a code block"
                )
            i += 1
            continue
        indent, marker, info = fence.group("indent", "fence", "info")
        info = info.strip()
        lang = info.split()[0].lstrip(".").lower() if info else ""
        if lang.startswith("{"):  # ```{.python title="x"}
            lang = lang.strip("{}").lstrip(".")
        title_match = _TITLE.search(info)
        title = None
        if title_match:
            title = title_match.group("dq") or title_match.group("sq") or title_match.group("bare")
        body_lines: list[str] = []
        j = i + 1
        while j < len(lines):
            candidate = lines[j]
            stripped = candidate.strip()
            if (
                stripped.startswith(marker[0] * len(marker))
                and set(stripped) == {marker[0]}
                and len(stripped) >= len(marker)
            ):
                break
            body_lines.append(
                candidate[len(indent) :] if candidate.startswith(indent) else candidate
            )
            j += 1
        else:
            raise DocParseError(f"{path}:{number}: code block never closed")
        skip = None
        background = expect = False
        for _, body in pending:
            if body.startswith("skip"):
                skip = body.partition(":")[2].strip()
            elif body == "background":
                background = True
            elif body == "expect":
                expect = True
        block = Block(
            lang=lang,
            code="\n".join(body_lines) + ("\n" if body_lines else ""),
            line=number,
            title=title,
            skip=skip,
            background=background,
            expect=expect,
        )
        if block.background and block.kind != "bash":
            raise DocParseError(f"{path}:{number}: 'background' applies to bash blocks only")
        if block.expect and block.lang != "text":
            raise DocParseError(f"{path}:{number}: 'expect' applies to text blocks only")
        page.items.append(block)
        pending = []
        i = j + 1
    if pending:
        raise DocParseError(f"{path}:{pending[0][0]}: a docs-test directive at the end of the page")
    return page


def read_page(path: Path, root: Path) -> Page:
    return parse_page(path.read_text(encoding="utf-8"), str(path.relative_to(root)))


_CUT = {"|", "||", "&&", ";", "&", ">", ">>", "<", "2>", "2>&1", "&>"}
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def sluice_commands(code: str) -> list[tuple[int, list[str]]]:
    """The ``sluice`` command lines of a bash block: (offset of the line in the block,
    arguments after ``sluice``). Continuation lines are joined; comments, leading variable
    assignments and what follows a pipe, ``&&``, ``;`` or a redirection are left out."""
    import shlex

    commands: list[tuple[int, list[str]]] = []
    lines = code.splitlines()
    k = 0
    while k < len(lines):
        start = k
        logical = lines[k]
        while logical.endswith("\\") and k + 1 < len(lines):
            k += 1
            logical = logical[:-1] + " " + lines[k]
        k += 1
        stripped = logical.strip()
        if not stripped or stripped.startswith("#"):
            continue
        try:
            words = shlex.split(stripped, comments=True)
        except ValueError:
            continue
        while words and _ASSIGNMENT.match(words[0]):
            words = words[1:]
        if not words or words[0] not in ("sluice", ".venv/bin/sluice"):
            continue
        args: list[str] = []
        for word in words[1:]:
            if word in _CUT or word.startswith((">", "2>")):
                break
            args.append(word)
        commands.append((start, args))
    return commands
