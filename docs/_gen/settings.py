"""Generates reference/settings.md from the pydantic settings model (run by mkdocs-gen-files).

Every field of ``enumerator_service.Settings``: its environment variable, type, default and
description (the model's ``Field(description=...)`` is the single source). Secret fields
(``SecretStr``) are marked secret and their defaults are never printed.
"""

from __future__ import annotations

import sys
import types
import typing
from datetime import date
from pathlib import Path
from typing import Any

import annotated_types
import mkdocs_gen_files
from pydantic import SecretStr
from pydantic.fields import FieldInfo

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from enumerator_service import Settings

PAGE = "reference/settings.md"

INTRO = """\
# Settings

Every setting of Sluice is an environment variable with the `SLUICE_` prefix, read when a
command, a Dagster code location or a Spark task starts (pydantic-settings). What belongs to
one pipeline — its source, tables, sink, caches — is in its definition, not here.

A bad value fails fast with one line naming the variable, and exit code 2:

```text
sluice: configuration error: SLUICE_PARALLELISM: Input should be greater than or equal to 1
```

A `SLUICE_*` variable that is not a setting is ignored; one an edit or two off a setting's
name (a letter missing, swapped or wrong) is also a warning, once per process:

```text
SLUICE_PARALELLISM is not a setting (did you mean SLUICE_PARALLELISM?): ignored
```

Passwords and secrets are never printed: every URL Sluice shows (errors, logs, `sluice db`
commands, the Dagster resources) has its password replaced by `***`.

*This page is generated from `enumerator_service.Settings`.*

| variable | type | default |
|---|---|---|
"""


def _markdown(text: str) -> str:
    """A description as Markdown: ``<placeholders>`` outside code spans are escaped (else
    they would be read as HTML tags and vanish)."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts)


def _is_secret(annotation: Any) -> bool:
    return annotation is SecretStr or SecretStr in typing.get_args(annotation)


def _bounds(info: FieldInfo) -> str:
    low = high = None
    low_op = high_op = ""
    for meta in info.metadata:
        if isinstance(meta, annotated_types.Ge):
            low, low_op = meta.ge, "≤"
        elif isinstance(meta, annotated_types.Gt):
            low, low_op = meta.gt, "<"
        elif isinstance(meta, annotated_types.Le):
            high, high_op = meta.le, "≤"
        elif isinstance(meta, annotated_types.Lt):
            high, high_op = meta.lt, "<"
    if low is None and high is None:
        return ""
    text = "x"
    if low is not None:
        text = f"{_number(low)} {low_op} {text}"
    if high is not None:
        text = f"{text} {high_op} {_number(high)}"
    return f" ({text})"


def _number(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return f"{value:_}".replace("_", ",") if isinstance(value, int) else str(value)


def _type(annotation: Any, info: FieldInfo) -> str:
    if _is_secret(annotation):
        return "secret string"
    args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
    optional = isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is (
        typing.Union
    )
    base = args[0] if optional and len(args) == 1 else annotation
    if typing.get_origin(base) is typing.Literal:
        return " or ".join(f"`{choice}`" for choice in typing.get_args(base))
    names = {
        str: "string",
        int: "integer",
        float: "number",
        bool: "boolean (`true`/`false`)",
        Path: "path",
        date: "date (`YYYY-MM-DD`)",
    }
    name = names.get(base, getattr(base, "__name__", str(base)))
    return name + _bounds(info)


def _default(name: str, annotation: Any, info: FieldInfo) -> str:
    value = info.get_default(call_default_factory=True)
    if value is None:
        return "unset"
    if _is_secret(annotation):
        return "(secret, not shown)"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if value == "":
        return "empty"
    if isinstance(value, int | float) and not isinstance(value, bool):
        text = f"`{_number(value)}`".replace(",", "")
        if name.endswith("_bytes") and value >= 1024:
            units = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")]
            for size, unit in units:
                if value % size == 0:
                    return f"{text} ({value // size} {unit})"
        return text
    return f"`{value}`"


def render() -> str:
    rows = []
    sections = []
    for name, info in Settings.model_fields.items():
        env = f"SLUICE_{name.upper()}"
        annotation = info.annotation
        kind = _type(annotation, info)
        default = _default(name, annotation, info)
        anchor = env.lower()
        rows.append(f"| [`{env}`](#{anchor}) | {kind} | {default} |")
        description = _markdown((info.description or "").strip())
        if not description:
            raise SystemExit(f"Settings.{name} has no description: add Field(description=...)")
        secret = (
            '\n\n!!! note "Secret"\n    Never logged or shown; its value is not printed here.'
            if _is_secret(annotation)
            else ""
        )
        sections.append(
            f"### `{env}` {{#{anchor}}}\n\n{description}\n\n"
            f"- **type:** {kind}\n- **default:** {default}{secret}\n"
        )
    return INTRO + "\n".join(rows) + "\n\n## Every setting\n\n" + "\n".join(sections)


with mkdocs_gen_files.open(PAGE, "w") as page:
    page.write(render())
