"""A local scoring service for ``examples.scoring``: ``POST /score`` with
``{"event_id", "amount"}`` answers ``{"score": …}``.

The score is ``min(1, amount / 500)`` rounded to 4 places. Requests whose event id hashes into
``slow_share`` are answered only after ``slow_seconds`` (to see the pipeline's ``timeout()``
fallback). At most ``limit`` requests are served at once (``busy`` counts them, ``peak`` is the
most seen); ``requests`` counts all. Binds 127.0.0.1.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["ScoringService", "is_slow", "score_of"]


def score_of(amount: float) -> float:
    return round(min(1.0, amount / 500.0), 4)


def is_slow(event_id: str, slow_share: float) -> bool:
    digest = hashlib.sha256(event_id.encode()).digest()
    return int.from_bytes(digest[:4], "big") / 2**32 < slow_share


class ScoringService(ThreadingHTTPServer):
    daemon_threads = True
    # The listen backlog: many clients connect at once (socketserver's default is 5).
    request_queue_size = 1024

    def __init__(
        self,
        port: int = 0,
        *,
        slow_share: float = 0.0,
        slow_seconds: float = 3.0,
        limit: int = 256,
    ) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.slow_share, self.slow_seconds = slow_share, slow_seconds
        self.slots = threading.BoundedSemaphore(limit)
        self.lock = threading.Lock()
        self.requests = self.busy = self.peak = 0
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/score"

    def start(self) -> ScoringService:
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> ScoringService:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    server: ScoringService

    def do_POST(self) -> None:
        service = self.server
        body: dict[str, Any] = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with service.slots:
            with service.lock:
                service.requests += 1
                service.busy += 1
                service.peak = max(service.peak, service.busy)
            try:
                if is_slow(str(body["event_id"]), service.slow_share):
                    time.sleep(service.slow_seconds)
                payload = json.dumps({"score": score_of(float(body["amount"]))}).encode()
            finally:
                with service.lock:
                    service.busy -= 1
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        return None


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=8700)
    parser.add_argument("--slow-share", type=float, default=0.01)
    args = parser.parse_args()
    with ScoringService(args.port, slow_share=args.slow_share) as service:
        print(f"scoring service on {service.url}")
        threading.Event().wait()
