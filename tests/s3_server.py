"""A real S3-protocol server on 127.0.0.1 for the tests: moto's ``ThreadedMotoServer``.

It speaks the S3 REST protocol over HTTP (what s3fs and pandas test against), so Sluice is
tested through pyarrow's real S3 client. What moto does not model: consistency delays (it is
strongly consistent, as S3 has been since 2020), request throttling (503 SlowDown), and
conditional writes beyond ``If-None-Match``; objects live in memory.

``S3Server.pause()`` / ``resume()`` make the endpoint refuse connections for a while with
its data kept (the fault tests' "endpoint unreachable").

Credentials are fake and come from the environment (the standard chain), as in production.

``s3_server(own_process=True)`` runs moto's server in a child process instead (no pause, no
``require_auth``): a client that blocks holding the GIL while it waits for the server would
otherwise starve the server's thread. deltalake 1.6's ``alter.set_table_properties`` does:
against the in-process server it hung for its 180 s retry budget.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pyarrow.fs as pafs
from moto.server import ThreadedMotoServer

__all__ = ["S3Server", "s3_server", "set_standard_chain"]

ACCESS_KEY = "sluice-test-key"
SECRET_KEY = "sluice-test-secret-do-not-log"  # tests assert it appears nowhere
REGION = "us-east-1"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class S3Server:
    """A running server: its endpoint URL, and a client that may create buckets."""

    port: int
    _server: ThreadedMotoServer | None
    _process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """What a Sluice process needs in its environment to use this server."""
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": REGION,
            "AWS_EC2_METADATA_DISABLED": "true",
            "SLUICE_S3_ENDPOINT_URL": self.endpoint_url,
            "SLUICE_S3_REGION": REGION,
        }

    def admin(self) -> pafs.S3FileSystem:
        """A client for the test itself (bucket creation allowed)."""
        return pafs.S3FileSystem(
            access_key=ACCESS_KEY,
            secret_key=SECRET_KEY,
            region=REGION,
            endpoint_override=f"127.0.0.1:{self.port}",
            scheme="http",
            allow_bucket_creation=True,
            allow_bucket_deletion=True,
        )

    def create_bucket(self, name: str) -> str:
        self.admin().create_dir(name)
        return f"s3://{name}"

    def client(self) -> Any:
        """A boto3 client (any key, e.g. ``a//b`` or ``a/../b``, which pyarrow refuses)."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
        )

    @contextmanager
    def require_auth(self) -> Iterator[None]:
        """Check credentials while inside: moto knows no access key, so every request is
        refused (403 InvalidAccessKeyId) as with wrong credentials."""
        self._in_process("require_auth")
        from moto import settings as moto_settings
        from moto.core.authorization import ActionAuthenticatorMixin

        before = moto_settings.INITIAL_NO_AUTH_ACTION_COUNT
        moto_settings.INITIAL_NO_AUTH_ACTION_COUNT = 0
        ActionAuthenticatorMixin.request_count = 0
        try:
            yield
        finally:
            moto_settings.INITIAL_NO_AUTH_ACTION_COUNT = before

    def pause(self) -> None:
        """Refuse connections (the server stops listening); its objects are kept."""
        self._in_process("pause")
        if self._server is not None:
            # ``resume`` (``start``) waits for this event: cleared, it returns only once the
            # new server listens.
            self._server._server_ready_event.clear()
            self._server._server.shutdown()  # the werkzeug server; the moto backend stays
            self._server._thread.join()
            self._server._server.server_close()

    def resume(self) -> None:
        """Listen again on the same port, with the same objects."""
        self._in_process("resume")
        if self._server is not None:
            self._server.start()

    def _in_process(self, what: str) -> None:
        if self._process is not None:
            raise NotImplementedError(f"{what}: only with the in-process server")

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None


def set_standard_chain() -> None:
    """Put the static part of the standard AWS chain (the fake credentials, the region) in
    ``os.environ`` now. Spark's Python workers get the environment the JVM started with,
    which may be before a module's server starts (another module may start Spark first), so
    a test module calls this at collection. The endpoint travels with a run's
    StorageOptions; credentials never do."""
    for key, value in {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_REGION": REGION,
        "AWS_EC2_METADATA_DISABLED": "true",
    }.items():
        os.environ.setdefault(key, value)


def _moto_process(port: int) -> subprocess.Popen[bytes]:
    """moto's server in a child process, once it accepts connections."""
    command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return process
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                process.wait()
                raise RuntimeError(f"moto server did not start on port {port}") from None
            time.sleep(0.05)


@contextmanager
def s3_server(own_process: bool = False) -> Iterator[S3Server]:
    """Start the server (in this process, or its own), put its settings in ``os.environ``
    (restored after), stop it."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    port = _free_port()
    if own_process:
        running = S3Server(port, None, _moto_process(port))
    else:
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        server.start()
        running = S3Server(port, server)
    saved = {key: os.environ.get(key) for key in running.env}
    os.environ.update(running.env)
    try:
        yield running
    finally:
        running.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
