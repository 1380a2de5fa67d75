"""What the docs test compares without running anything: a ``sluice ...`` line against the
click CLI, and a page's shown output against the real one (``expect`` blocks)."""

from __future__ import annotations

import contextlib
import io
import re

import click

__all__ = ["expect_matches", "parse_cli"]


def parse_cli(group: click.Command, args: list[str]) -> str | None:
    """Parse ``args`` as the click CLI would, invoking nothing: None, or the usage error."""
    sink = io.StringIO()
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            ctx = group.make_context("sluice", list(args))
            command = group
            while isinstance(command, click.Group):
                rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
                if not rest:
                    break
                name, sub, remaining = command.resolve_command(ctx, rest)
                assert sub is not None and name is not None
                ctx = sub.make_context(name, remaining, parent=ctx)
                command = sub
    except click.exceptions.NoArgsIsHelpError:
        return None
    except click.exceptions.Exit:  # --help, --version
        return None
    except click.UsageError as exc:
        return exc.format_message()
    except click.ClickException as exc:
        return exc.format_message()
    return None


_WILDCARD = re.compile(r"(?:\\\.){3}|…")


def expect_matches(expected: str, output: str) -> str | None:
    """Every non-blank line of ``expected`` appears in ``output``, in order (runs of white
    space match any white space; ``...`` or ``…`` matches anything): None, or the first line
    that does not."""
    position = 0
    for line in expected.splitlines():
        if not line.strip():
            continue
        pattern = re.escape(line.strip())
        pattern = re.sub(r"(?:\\\s)+", r"\\s+", pattern)  # escaped spaces
        pattern = re.sub(r"\s+", r"\\s+", pattern)
        pattern = _WILDCARD.sub(".*?", pattern)
        found = re.compile(pattern).search(output, position)
        if found is None:
            return line
        position = found.end()
    return None
