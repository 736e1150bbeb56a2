"""The studio's memory over many runs: start the real app (offline model), run generations through the API
from several browser sessions, and report the server's resident memory (RSS) after a warm-up and after every 10 runs.

    python scripts/dev/app_memory.py --runs 50
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from app_server import AppServer  # noqa: E402

PROMPTS = ['Repeat this JSON exactly: {"a": 1, "b": [2, 3], "c": "four"}',
           "Add type hints and keep the rest identical:\n\ndef add(a, b):\n    return a + b",
           "Write two sentences about the sea."]
METHODS = ["switchsd", "eagle3", "copyspec", "vanilla", "pld"]


def rss_mb(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    args = ap.parse_args()
    from gradio_client import Client
    server = AppServer()
    try:
        clients = [Client(server.url, verbose=False) for _ in range(5)]

        def run(i: int) -> None:
            c = clients[i % len(clients)]
            c.predict(PROMPTS[i % len(PROMPTS)], METHODS[i % len(METHODS)], 0.0, args.max_new_tokens, True, False,
                      0.5, 3, 10, 20, 0, "auto", api_name="/generate")
            if i % 10 == 9:                                   # a race now and then (four engines each)
                c.predict(PROMPTS[0], 24, True, True, "auto", api_name="/race")
        for i in range(args.warmup):
            run(i)
        time.sleep(1)
        rows = [(0, rss_mb(server.proc.pid))]
        t0 = time.time()
        for i in range(args.runs):
            run(args.warmup + i)
            if (i + 1) % 10 == 0:
                rows.append((i + 1, rss_mb(server.proc.pid)))
                print(f"after {i + 1} runs: RSS {rows[-1][1]:.0f} MB ({time.time() - t0:.0f} s)", flush=True)
        print(json.dumps({"rss_mb": {str(n): round(m, 1) for n, m in rows},
                          "growth_mb": round(rows[-1][1] - rows[0][1], 1), "runs": args.runs}))
    finally:
        server.close()


if __name__ == "__main__":
    main()
