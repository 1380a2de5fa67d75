"""``SLUICE_*`` environment variables that look like a misspelled setting.

pydantic-settings ignores variables it does not know, so ``SLUICE_MAX_WATERMARK_LAG_SECOND``
(one letter short) would leave the default in force without a word. A variable an edit or two
off a setting's name is worth a warning; any other (a ``url_env`` of your own, such as
``SLUICE_ORDERS_DB_URL`` or ``SLUICE_SHOP_DATABASE_URL``) is none of Sluice's business.

Threading: ``misspelled_settings`` is pure; ``warn_misspelled_settings`` may be called from
any thread (a duplicate warning from a race is harmless).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

__all__ = ["misspelled_settings", "warn_misspelled_settings"]

_log = logging.getLogger("enumerator_service.settings")
_warned: set[str] = set()  # each once per process (settings are loaded on every tick)

_PREFIX = "SLUICE_"


def _distance(a: str, b: str) -> int:
    """Edits (insert, delete, substitute, swap two neighbours) from ``a`` to ``b``."""
    rows = [list(range(len(b) + 1))]
    for i, x in enumerate(a, 1):
        row = [i]
        for j, y in enumerate(b, 1):
            row.append(min(rows[-1][j] + 1, row[j - 1] + 1, rows[-1][j - 1] + (x != y)))
            if i > 1 and j > 1 and x == b[j - 2] and a[i - 2] == y:
                row[j] = min(row[j], rows[-2][j - 2] + 1)
        rows.append(row)
    return rows[-1][-1]


def _typo_of(name: str, setting: str) -> bool:
    """One edit off (two for a name over 12 letters): a typo, not a name of one's own
    (``SHOP_DATABASE_URL``, ``DATABASE_URL_2`` are not typos of ``DATABASE_URL``)."""
    allowed = 2 if len(setting) > 12 else 1
    return abs(len(name) - len(setting)) <= allowed and _distance(name, setting) <= allowed


def misspelled_settings(environ: Mapping[str, str], settings: Iterable[str]) -> list[str]:
    """One line per ``SLUICE_*`` variable of ``environ`` that is not one of ``settings``
    (field names) but a typo of one: "SLUICE_X is not a setting (did you mean SLUICE_Y?)"."""
    known = sorted(name.upper() for name in settings)
    lines = []
    for variable in sorted(environ):
        upper = variable.upper()
        name = upper.removeprefix(_PREFIX)
        if not upper.startswith(_PREFIX) or name in known:
            continue
        close = [setting for setting in known if _typo_of(name, setting)]
        if close:
            lines.append(
                f"{variable} is not a setting (did you mean {_PREFIX}{close[0]}?): ignored"
            )
    return lines


def warn_misspelled_settings(environ: Mapping[str, str], settings: Iterable[str]) -> None:
    """Log each of :func:`misspelled_settings`' lines as a warning, once per process."""
    for line in misspelled_settings(environ, settings):
        if line not in _warned:
            _warned.add(line)
            _log.warning(line)
