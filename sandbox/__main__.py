"""`python -m sandbox`: run the fake outside world on its own, e.g. beside a demo or a benchmark."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from pathlib import Path

from crashsafe.sandbox.app import serve


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sandbox", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port, printed on start")
    parser.add_argument("--data-dir", type=Path, default=None, help="keep the books in SQLite here (durable)")
    args = parser.parse_args(argv)
    # uvicorn shuts down gracefully on Ctrl-C and then re-raises it; the traceback would be noise.
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.host, args.port, data_dir=args.data_dir))


if __name__ == "__main__":
    main()
