"""The same configuration started again and again: does each start serve the same runtime and the same bytes?

    .venv/bin/python -m bench.starts [--starts 10] [--checkout PATH] [ENCODER_*=... in the environment]

Starts the service as the image runs it (``python -m app.serve``, settings from the environment; the bundled model
unless ENCODER_MODEL says otherwise), one start after another, and at each reads /info's runtime and precision and
the answers to the same requests: /encode of one text and of several (JSON, and npz), /v1/embeddings in base64. Prints
a line per start (seconds until ready, the runtime, a digest of the answers) and whether every start gave the same.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
import urllib.request
from pathlib import Path

from bench.run import ROOT, free_port, print_header, start_service

TEXTS = ["The quick brown fox.", "A lazy dog sleeps in the afternoon sun by the river.", "Rain.", "x " * 120]
REQUESTS = [
    ("/encode", {"texts": TEXTS[:1]}, {}),
    ("/encode", {"texts": TEXTS}, {}),
    ("/encode", {"texts": TEXTS}, {"Accept": "application/x-npz"}),
    ("/v1/embeddings", {"input": TEXTS, "encoding_format": "base64"}, {}),
]


def answers(port: int) -> tuple[str, str]:
    """(runtime and precision from /info, a digest of every answer's bytes)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/info", timeout=30) as response:
        info = json.load(response)
    digest = hashlib.sha256()
    for path, body, headers in REQUESTS:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(), {"Content-Type": "application/json", **headers}
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            digest.update(response.read())
    return f"{info['runtime']}, {info['dtype']}", digest.hexdigest()[:16]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=10)
    parser.add_argument("--checkout", type=Path, default=ROOT, help="the checkout whose service is started")
    args = parser.parse_args()
    print_header("starts")
    seen = set()
    for start in range(args.starts):
        port = free_port()
        started = time.monotonic()
        process = start_service(port, {}, checkout=args.checkout, quiet=True, supervised=True)
        try:
            ready = time.monotonic() - started
            runtime, digest = answers(port)
        finally:
            process.terminate()
            process.wait(60)
        seen.add((runtime, digest))
        print(f"start {start + 1}: ready in {ready:.1f} s, {runtime}, answers {digest}", flush=True)
    print(f"{args.starts} starts: {len(seen)} distinct runtime and answers{'' if len(seen) == 1 else ' (differ!)'}")
    return 0 if len(seen) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
