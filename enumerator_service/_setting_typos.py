"""``SLUICE_*`` environment variables that look like a misspelled setting.

pydantic-settings ignores variables it does not know, so ``SLUICE_MAX_WATERMARK_LAG_SECOND``
(one letter short) would leave the default in force without a word. A variable close to a
setting's name is worth a warning; one that is not (a ``url_env`` of your own, such as
``SLUICE_ORDERS_DB_URL``) is none of Sluice's business.

Threading: ``misspelled_settings`` is pure; ``warn_misspelled_settings`` may be called from
any thread (a duplicate warning from a race is harmless).
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Iterable, Mapping

__all__ = ["misspelled_settings", "warn_misspelled_settings"]

_log = logging.getLogger("enumerator_service.settings")
_warned: set[str] = set()  # each once per process (settings are loaded on every tick)

_PREFIX = "SLUICE_"
#: Close enough to be a typo of a setting, not a variable of one's own.
_CUTOFF = 0.88


def misspelled_settings(environ: Mapping[str, str], settings: Iterable[str]) -> list[str]:
    """One line per ``SLUICE_*`` variable of ``environ`` that is not one of ``settings``
    (field names) but close to one: "SLUICE_X is not a setting (did you mean SLUICE_Y?)"."""
    known = {f"{_PREFIX}{name.upper()}" for name in settings}
    lines = []
    for variable in sorted(environ):
        upper = variable.upper()
        if not upper.startswith(_PREFIX) or upper in known:
            continue
        close = difflib.get_close_matches(upper, known, n=1, cutoff=_CUTOFF)
        if close:
            lines.append(f"{variable} is not a setting (did you mean {close[0]}?): ignored")
    return lines


def warn_misspelled_settings(environ: Mapping[str, str], settings: Iterable[str]) -> None:
    """Log each of :func:`misspelled_settings`' lines as a warning, once per process."""
    for line in misspelled_settings(environ, settings):
        if line not in _warned:
            _warned.add(line)
            _log.warning(line)
