"""Concurrent serving on loopback: N simulated users against the running web app (real model, the
built-in seed library), each asking seed questions through `gradio_client` `/answer` with the
exactness check off (the default chat path is measured elsewhere). Throughput and latency p50/p95
at 1, 4 and 8 users; bounded in request count and time. The model runs one request at a time per
process behind Gradio's queue, so throughput is expected flat and latency to grow with users.

Writes docs/bench/serving.json.  Usage: .venv/bin/python -m bench.serving [--users 1,4,8] [--per-user 4]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import socket
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import app  # noqa: E402
import retrieval  # noqa: E402,F401  (faiss before torch)
import services  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def main() -> None:
    from gradio_client import Client

    ap = argparse.ArgumentParser()
    ap.add_argument("--users", default="1,4,8")
    ap.add_argument("--per-user", type=int, default=4)
    ap.add_argument("--level-timeout-s", type=float, default=300)
    ap.add_argument("--out", default=str(ROOT / "docs" / "bench" / "serving.json"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvgraft-serving-") as home:
        lib = services.Library(home=home)
        app.seed_library(lib)
        questions = [it["question"] for it in app.seed_items()[0]]
        demo = app.build_app(lib)
        demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=_free_port(), quiet=True)
        url = demo.local_url
        levels = []
        try:
            Client(url, verbose=False).predict(questions[0], check=False, api_name="/answer")  # warm-up
            for users in [int(u) for u in args.users.split(",")]:

                def user(u: int, users=users) -> list[tuple[float, bool]]:
                    c = Client(url, verbose=False)
                    out = []
                    for j in range(args.per_user):
                        q = questions[(u * args.per_user + j) % len(questions)]
                        t = time.perf_counter()
                        try:
                            r = c.predict(q, check=False, max_new_tokens=16, api_name="/answer")
                            ok = r["tier"] == "exact" and bool(r["answer"])
                        except Exception:  # counted as an error, reported
                            ok = False
                        out.append((time.perf_counter() - t, ok))
                    return out

                t0 = time.perf_counter()
                with ThreadPoolExecutor(users) as pool:
                    results = [
                        x for f in [pool.submit(user, u) for u in range(users)] for x in f.result(timeout=args.level_timeout_s)
                    ]
                wall = time.perf_counter() - t0
                lat = [r[0] for r in results]
                level = {
                    "users": users,
                    "requests": len(results),
                    "errors": sum(1 for r in results if not r[1]),
                    "wall_s": wall,
                    "throughput_rps": len(results) / wall,
                    "latency_p50_s": statistics.median(lat),
                    "latency_p95_s": pct(lat, 0.95),
                }
                levels.append(level)
                print(json.dumps(level), flush=True)
        finally:
            demo.close()
            lib.close()
    out = {
        "benchmark": "serving",
        "command": ".venv/bin/python -m bench.serving",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count()},
        "setup": f"real default model, built-in seed library, /answer with retrieval on and check off, max_new_tokens 16, "
        f"{args.per_user} requests per user, loopback",
        "levels": levels,
    }
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print("\n| users | requests | errors | throughput (req/s) | p50 (s) | p95 (s) |\n|---:|---:|---:|---:|---:|---:|")
    for lv in levels:
        print(
            f"| {lv['users']} | {lv['requests']} | {lv['errors']} | {lv['throughput_rps']:.2f} | "
            f"{lv['latency_p50_s']:.2f} | {lv['latency_p95_s']:.2f} |"
        )


if __name__ == "__main__":
    main()
