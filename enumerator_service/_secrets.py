"""Database passwords: hiding them wherever a URL or DSN is shown, and moving them around.

:func:`redact_url` is the one redaction of a connection string in Sluice: every message, log
line, repr and metadata value that shows a URL goes through it. It is built on SQLAlchemy's URL
parser (the same parser that connects), so what it hides is what the driver would send as the
password: the URL's password (whatever characters it holds: ``/``, ``@``, ``%``, ``:``, ``#``,
unicode, percent-encoded or not) and secret query parameters (``?password=…``). A URL the
parser cannot read, or reads ambiguously (a raw ``@`` in the password), fails closed: all
between the scheme and the host is hidden. libpq ``key=value`` strings have their
``password=`` values hidden; any other string is hidden whole.

:func:`redact_text` scrubs a free text (an exception message, a task's traceback) of a known
URL's password in every encoding, and of any URL it contains.
"""

from __future__ import annotations

import re
from urllib.parse import quote, quote_plus

from sqlalchemy.engine import URL, make_url

__all__ = [
    "MASK",
    "password_of",
    "redact_text",
    "redact_url",
    "split_password",
    "with_password",
]

MASK = "***"
#: Query parameters whose values are secrets (libpq's ``password`` and ``sslpassword``).
SECRET_PARAMETERS = frozenset({"password", "sslpassword"})
_KEY_VALUE = re.compile(r"\s*(?:\w+\s*=\s*(?:'(?:[^'\\]|\\.)*'|[^\s']+)\s*)*")
_KEY_VALUE_SECRET = re.compile(
    r"\b(password|sslpassword)(\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s']+)", re.IGNORECASE
)
#: A URL in free text; punctuation right after it (``url: reason``) is not part of it.
_URL_IN_TEXT = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]*[^\s'\"<>.,:;)\]]")


def _parse(url: str) -> URL | None:
    """``url`` parsed, or None when it cannot be read unambiguously: a raw ``@`` in the
    password makes the parser take part of the password for the host or database."""
    try:
        parsed = make_url(url)
    except Exception:  # ValueError (port), ArgumentError (syntax): nothing is trusted
        return None
    for part in (parsed.host, parsed.database):
        if part is not None and "@" in part:
            return None
    return parsed


def redact_url(url: str) -> str:
    """``url`` with its password and secret query parameters replaced by ``***`` (safe for
    logs, errors and metadata); see the module docstring for the forms handled."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        if _KEY_VALUE.fullmatch(url):
            return _KEY_VALUE_SECRET.sub(rf"\1\2{MASK}", url)
        return MASK
    parsed = _parse(url)
    if parsed is None:
        # Fail closed: the credentials end at the last "@" (or cannot be told apart at all).
        _, at, tail = rest.rpartition("@")
        if not at:
            return f"{scheme}://{MASK}"
        where, query, _ = tail.partition("?")
        return f"{scheme}://{MASK}@{where.split('#')[0]}" + (f"?{MASK}" if query else "")
    hidden = [key for key in parsed.query if key.lower() in SECRET_PARAMETERS]
    # A stand-in the renderer does not percent-encode, swapped for the mask afterwards.
    stand_in = "REDACTED0SLUICE"
    shown = parsed.update_query_dict(dict.fromkeys(hidden, stand_in))
    if not parsed.password:
        # An empty password ("user:@", what the embedded server's URL has) is no password:
        # a mask would suggest one.
        shown = shown._replace(password=None)
    return shown.render_as_string(hide_password=True).replace(stand_in, MASK)


def _forms(secret: str) -> set[str]:
    """``secret`` as it may appear in text: raw and in the usual URL encodings."""
    forms = {secret, quote(secret, safe=""), quote(secret), quote_plus(secret)}
    forms |= {form.lower() for form in forms if "%" in form}
    return {form for form in forms if form}


def password_of(url: str) -> list[str]:
    """Every password ``url`` carries (its own and ``?password=``), as far as any reading of
    it goes: for an ambiguous URL also what stands between the user's ``:`` and the last
    ``@`` (what a careless reader might take for it)."""
    found: list[str] = []
    parsed = _parse(url)
    if parsed is not None:
        if parsed.password:
            found.append(str(parsed.password))
        for key, value in parsed.query.items():
            if key.lower() in SECRET_PARAMETERS:
                found.extend([value] if isinstance(value, str) else list(value))
    _, sep, rest = url.partition("://")
    userinfo, at, _ = rest.rpartition("@")
    if sep and at and ":" in userinfo:
        found.append(userinfo.split(":", 1)[1])
    return [secret for secret in found if secret]


def redact_text(text: str, *urls: str) -> str:
    """``text`` without the passwords of ``urls`` (raw or URL-encoded, longest first) and
    with every URL in it redacted."""
    secrets = {form for url in urls for secret in password_of(url) for form in _forms(secret)}
    for form in sorted(secrets, key=len, reverse=True):
        text = text.replace(form, MASK)
    return _URL_IN_TEXT.sub(lambda match: redact_url(match.group(0)), text)


def split_password(url: str) -> tuple[str, str | None]:
    """(``url`` without any password, the password or None): an empty password counts as
    none, ``?password=`` is moved out too. ValueError if the URL holds two different
    passwords or cannot be parsed."""
    parsed = _parse(url)
    if parsed is None:
        raise ValueError(f"cannot parse the URL {redact_url(url)}")
    query = dict(parsed.query)
    if any(key.lower() in SECRET_PARAMETERS - {"password"} for key in query):
        raise ValueError("sslpassword cannot be passed in the URL (use an unencrypted key file)")
    in_query = query.pop("password", None)
    if in_query is not None and not isinstance(in_query, str):
        raise ValueError("the URL has more than one ?password= parameter")
    own = parsed.password or None
    if own and in_query and str(own) != in_query:
        raise ValueError("the URL has a password and a different ?password= parameter")
    # URL.set() takes None for "unchanged": _replace (URL is a NamedTuple) clears it.
    bare = parsed._replace(password=None).set(query=query)
    return bare.render_as_string(hide_password=False), (str(own) if own else in_query) or None


def with_password(url: str, password: str | None) -> str:
    """``url`` (parsed) with ``password`` as its password (None: without one). ValueError if
    the URL names no user: the password would have nowhere to go."""
    parsed = make_url(url)
    if password and parsed.username is None:
        raise ValueError("a password needs a user name in the URL (postgresql://USER@host/db)")
    return parsed._replace(password=password).render_as_string(hide_password=False)
