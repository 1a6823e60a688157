"""`python -m bench.otlp_sink`: an OTLP/HTTP endpoint that takes every batch and keeps none, for `bench/run.py
--otel` (spans on, exported, at the cost of export and nothing else). Prints `otlp sink on http://H:P`."""

from __future__ import annotations

import subprocess
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_EMPTY_RESPONSE = b""  # an ExportTraceServiceResponse with no partial success: zero bytes of protobuf


class _Discard(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the exporters reuse their connection

    def do_POST(self) -> None:  # noqa: N802 -- http.server's name
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(_EMPTY_RESPONSE)))
        self.end_headers()
        self.wfile.write(_EMPTY_RESPONSE)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 -- http.server's signature
        pass


def start() -> tuple[subprocess.Popen[bytes], str]:
    """The sink in its own process (its CPU is not the driver's); its URL once it listens."""
    process = subprocess.Popen([sys.executable, "-m", "bench.otlp_sink"], stdout=subprocess.PIPE)
    assert process.stdout is not None
    line = process.stdout.readline().decode().strip()
    if not line.startswith("otlp sink on "):
        process.kill()
        raise RuntimeError(f"the OTLP sink did not start: {line!r}")
    return process, line.removeprefix("otlp sink on ")


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Discard)
    host, port = server.server_address[:2]
    print(f"otlp sink on http://{host!s}:{port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
