"""URL forms a password can take, shared by the secrets tests (``tests/unit/test_secrets.py``,
``tests/integration/test_secret_surfaces.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote, quote_plus


@dataclass(frozen=True)
class Form:
    """A URL form: ``url(host_part)`` holds ``password`` (None: no password at all)."""

    name: str
    password: str | None
    template: str  # "{pw}" is the password as the URL holds it, "{at}" the host and database

    def url(self, at: str = "db.example:5432/app") -> str:
        shown = "" if self.password is None else self.encoded()
        url = self.template.format(pw=shown, at=at)
        first = url.find("?")
        return url[: first + 1] + url[first + 1 :].replace("?", "&") if first >= 0 else url

    def encoded(self) -> str:
        assert self.password is not None
        raw = "{pw}" in self.template and "raw" in self.name
        return self.password if raw else quote(self.password, safe="")


FORMS = [
    Form("slash raw", "sl/ash/pw", "postgresql://alice:{pw}@{at}"),
    Form("slash encoded", "sl/ash/pw", "postgresql://alice:{pw}@{at}"),
    Form("at encoded", "at@sign@pw", "postgresql://alice:{pw}@{at}"),
    Form("percent raw", "per%cent%zz", "postgresql://alice:{pw}@{at}"),
    Form("percent encoded", "per%cent", "postgresql://alice:{pw}@{at}"),
    Form("colon raw", "co:lon:pw", "postgresql://alice:{pw}@{at}"),
    Form("hash raw", "ha#sh#pw", "postgresql://alice:{pw}@{at}"),
    Form("hash encoded", "ha#sh#pw", "postgresql://alice:{pw}@{at}"),
    Form("unicode raw", "ünï©ødé-pw", "postgresql://alice:{pw}@{at}"),
    Form("unicode encoded", "ünï©ødé-pw", "postgresql://alice:{pw}@{at}"),
    Form("all of them", "a/b@c%d:e#f?g ü", "postgresql+psycopg://alice:{pw}@{at}"),
    Form("query password", "q/p@ss%w0rd", "postgresql://alice@{at}?password={pw}&sslmode=prefer"),
    Form("no user", None, "postgresql://{at}"),
    Form("user only", None, "postgresql://alice@{at}"),
]
#: A Unix-socket host given as a query parameter (how the embedded Postgres is reached).
SOCKET = "/app?host=/var/run/postgresql"


def forms_of(secret: str) -> set[str]:
    """``secret`` in every encoding it could leak in (raw, URL-encoded, form-encoded)."""
    encoded = {secret, quote(secret, safe=""), quote(secret), quote_plus(secret)}
    return encoded | {form.lower() for form in encoded}


def assert_hidden(text: str, form: Form) -> None:
    """No form of ``form``'s password in ``text``, also across the line breaks a terminal
    renderer (rich) puts into long words."""
    if form.password is not None:
        joined = (text, text.replace("\n", ""), text.replace("\n", " "))
        for leaked in forms_of(form.password):
            for shown in joined:
                assert leaked not in shown, f"{form.name}: {leaked!r} shown in {text!r}"
