"""Concurrent serving on loopback: N simulated users against the running web app (real model, the
built-in seed library), each asking seed questions through `gradio_client` `/answer` with the
exactness check off (the default chat path is measured elsewhere). Throughput and latency p50/p95
at 1, 4 and 8 users; bounded in request count and time. Two apps over the same store and model, in
one run, each user count measured on both in turn: one answer at a time (the app before answers were
taken together: KVGRAFT_DECODE_TOGETHER=1) and up to 8 at once with their decode steps taken together
(graft_core.batch; the default). Every answer's output and logits hashes must equal the same
question's answer alone (`byte_identical`). The users run in a process of their own (bench/users.py,
`gradio_client`, one client each, connected before the clock starts), as remote users would: in the
server's process they shared its interpreter lock, and the clients' own work (a new HTTP client and TLS
context per request) then counted against the server.

A third app is the "today" baseline the serving target was set against: one answer at a time on MKL's products
(KVGRAFT_LINEAR=torch, no fma16), over a store of its own seeded the same way (artifacts made with one
product kernel are refused by the other). `throughput_vs_today` is each level's throughput over that
app's at the same user count, in this run. `--no-today` leaves it out.

Writes docs/bench/serving.json.  Usage: .venv/bin/python -m bench.serving [--users 1,4,8] [--per-user 8]

Ray mode (`--ray --replicas 1,2`, docs/SCALING.md): the same seed questions posted to /answer of a Ray Serve
deployment (serving/) by N users (default 8) with the stdlib client (its retries), in ONE run with each
replica count in turn; each replica computes with `--threads` (default 1) torch threads. The bench deposits
its own seed store with that thread count (it is part of the model fingerprint) in a temporary home and
SQLite catalog shared by the replicas (one machine; `--db-url` for PostgreSQL). `--tiny` runs it on a tiny
random model (a smoke test: nothing is written unless `--out` is given); the real-model run writes
docs/bench/serving-ray.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import retrieval  # noqa: E402,F401  (faiss before torch)
import services  # noqa: E402
from services import AnswerOptions, limits, seed  # noqa: E402
from web import app  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--users", default=None, help="user counts (default 1,4,8; Ray mode: 8)")
    ap.add_argument("--per-user", type=int, default=8)
    ap.add_argument(
        "--together", default="1,8", help="answers at once per app (FairTurns slots), measured in turn per user count"
    )
    ap.add_argument("--level-timeout-s", type=float, default=300)
    ap.add_argument("--no-today", action="store_true", help="leave out the MKL, one-at-a-time app (the serving target's 'today')")
    ap.add_argument("--out", default=None, help="default docs/bench/serving.json (Ray mode: serving-ray.json, real model only)")
    ap.add_argument("--ray", action="store_true", help="post to a Ray Serve deployment instead of the Gradio app")
    ap.add_argument("--replicas", default="1,2", help="Ray mode: replica counts, measured in turn in this run")
    ap.add_argument("--threads", type=int, default=1, help="Ray mode: torch threads per replica (and for the seeding)")
    ap.add_argument("--tiny", action="store_true", help="Ray mode: a tiny random model (smoke test, written only with --out)")
    ap.add_argument("--db-url", default=None, help="Ray mode: the shared catalog (default SQLite in the temporary home)")
    args = ap.parse_args()
    if args.ray:
        return ray_main(args)
    if args.out is None:
        args.out = str(ROOT / "docs" / "bench" / "serving.json")
    gradio_main(args)


def _users(url: str, questions: list[str], users: int, per_user: int, timeout_s: float) -> dict:
    """`users` clients in a process of their own (bench/users.py), each asking `per_user` questions;
    started and connected before the clock starts. Returns its {"wall_s", "requests"}."""
    spec = {"url": url, "users": users, "per_user": per_user, "questions": questions, "max_new_tokens": 16}
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.users"], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        proc.stdin.write(json.dumps(spec) + "\n")
        proc.stdin.flush()
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError("bench.users did not start (its error is above)")
        line = proc.communicate("go\n", timeout=timeout_s)[0].strip()
    finally:
        if proc.poll() is None:
            proc.kill()
    if not line:
        raise RuntimeError("bench.users printed no results (its error is above)")
    return json.loads(line)


def gradio_main(args) -> None:
    from gradio_client import Client

    from access.guard import FairTurns, Guard, per_address

    args.users = args.users or "1,4,8"
    questions = [it["question"] for it in seed.seed_items()[0]]
    warm_limit = limits.warm_proofs_limit()

    def prepared(home: str, lm=None):
        """A seeded, warmed store and each question's hashes answered alone in process."""
        lib = services.Library(home=home, lm=lm)
        seed.seed_library(lib)
        warm = lib.warm_proofs(warm_limit)  # what the app's start-up does next (KVGRAFT_WARM_PROOFS)
        print(warm.line(), flush=True)
        alone = {}  # question -> (output_sha256, logits_sha256) answered alone, in process
        for q in questions:
            r = lib.answer(q, AnswerOptions(max_new_tokens=16, record=False))
            alone[q] = (r.output_sha256, r.logits_sha256)
        return lib, warm, alone

    with tempfile.TemporaryDirectory(prefix="kvgraft-serving-") as home:
        lib, warm, alone = prepared(str(Path(home) / "now"))
        apps = {}  # label -> (engine, answers at once, library, hashes alone)
        if not args.no_today:
            from graft_core import model as model_mod

            today_lm = model_mod.load(linear="torch")
            today_lib, _, today_alone = prepared(str(Path(home) / "today"), lm=today_lm)
            apps["today"] = ("mkl", 1, today_lib, today_alone)
        for together in [int(t) for t in args.together.split(",")]:
            apps[f"together={together}"] = ("fma16" if "fma16" in lib.lm.products else "mkl", together, lib, alone)
        demos = {}
        for label, (_, together, app_lib, _) in apps.items():
            guard = Guard("", turns=FairTurns(per_address=per_address(), slots=together))
            demos[label] = app.build_app(app_lib, guard=guard)
            demos[label].launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=_free_port(), quiet=True)
        levels = []
        try:
            for demo in demos.values():
                Client(demo.local_url, verbose=False).predict(questions[0], check=False, api_name="/answer")  # warm-up
            for users, (label, demo) in [(int(u), d) for u in args.users.split(",") for d in demos.items()]:
                engine, together, _, hashes = apps[label]
                run = _users(demo.local_url, questions, users, args.per_user, args.level_timeout_s)
                results, wall = run["requests"], run["wall_s"]
                lat = [r[0] for r in results]
                level = {
                    "app": label,
                    "products": engine,
                    "users": users,
                    "together": together,
                    "requests": len(results),
                    "errors": sum(1 for r in results if not r[1]),
                    "byte_identical": all((r[3], r[4]) == hashes[r[2]] for r in results),
                    "wall_s": wall,
                    "throughput_rps": len(results) / wall,
                    "latency_p50_s": statistics.median(lat),
                    "latency_p95_s": pct(lat, 0.95),
                }
                levels.append(level)
                print(json.dumps(level), flush=True)
        finally:
            for demo in demos.values():
                demo.close()
            for app_lib in {id(a[2]): a[2] for a in apps.values()}.values():
                app_lib.close()
    out = {
        "benchmark": "serving",
        "command": ".venv/bin/python -m bench.serving" + (" --no-today" if args.no_today else ""),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count()},
        "setup": f"real default model, built-in seed library, /answer with retrieval on and check off, max_new_tokens 16, "
        f"{args.per_user} requests per user from a process of their own (bench/users.py, gradio_client), loopback; apps over one store and model, answers at once: {args.together}, "
        "plus (unless --no-today) 'today': MKL's products, one answer at a time, over its own store; each user count measured on each in turn",
        "products": lib.lm.products,
        "warm_proofs": {"limit": warm_limit, "proved": warm.proved, "seconds": warm.seconds},
        "levels": levels,
        "throughput_ratio": {  # the most answers at once over one at a time, both on this engine's products
            str(lv["users"]): lv["throughput_rps"] / one["throughput_rps"]
            for lv in levels
            if lv["app"] != "today" and lv["together"] > 1
            for one in [x for x in levels if x["users"] == lv["users"] and x["app"] == "together=1"]
        },
        "throughput_vs_today": {
            f"{lv['users']} {lv['app']}": lv["throughput_rps"] / today["throughput_rps"]
            for lv in levels
            if lv["app"] != "today"
            for today in [x for x in levels if x["users"] == lv["users"] and x["app"] == "today"]
        },
    }
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(
        "\n| users | products | answers at once | requests | errors | byte-identical | throughput (req/s) | p50 (s) | p95 (s) |"
        "\n|---:|---|---:|---:|---:|---|---:|---:|---:|"
    )
    for lv in levels:
        print(
            f"| {lv['users']} | {lv['products']}{' (today)' if lv['app'] == 'today' else ''} | {lv['together']} | {lv['requests']} | "
            f"{lv['errors']} | {'yes' if lv['byte_identical'] else 'NO'} | "
            f"{lv['throughput_rps']:.2f} | {lv['latency_p50_s']:.2f} | {lv['latency_p95_s']:.2f} |"
        )


# ---- Ray mode -----------------------------------------------------------------------------------


def _seed_store(home: Path, args) -> tuple[list[str], object]:
    """Deposit the seed library into the shared store the replicas will open, with the replicas' thread
    count (part of the model fingerprint). The real model seeds through the gate; a tiny random model
    cannot pass it, so it deposits the same items' solutions as free text. Returns (questions, settings)."""
    from retrieval import HashEmbedder
    from serving import ServeSettings

    os.environ["KVGRAFT_THREADS"] = str(args.threads)  # the pin applies it when the model loads below
    model = None
    if args.tiny:
        from graft_core import tiny

        model = str(tiny.build("gemma3", home / "tiny-model"))
    db_url = args.db_url or f"sqlite:///{home / 'catalog.sqlite3'}"
    settings = ServeSettings(
        db_url=db_url,
        blob_root=home / "blobs",
        state_root=home / "replica-state",
        model=model,
        embedder="hash" if args.tiny else "minilm",
        threads=args.threads,
        replica_cpus=1.0,
        health_check_period_s=10.0,
        port=_free_port(),
    )
    embedder = HashEmbedder() if args.tiny else None
    lib = services.Library(home=home / "seeder", db_url=db_url, model_name=model, embedder=embedder, blob_root=settings.blob_root)
    try:
        items = seed.seed_items()[0]
        if args.tiny:
            for it in items:
                lib.deposit_text(it["solution"], title=it["question"][:40])
        else:
            seed.seed_library(lib)
        print(f"seed store: {lib.count()} artifacts, model fingerprint {lib.lm.fingerprint[:16]}", flush=True)
    finally:
        lib.close()
    return [it["question"] for it in items], settings


def _ray_level(url: str, questions: list[str], users: int, per_user: int, timeout_s: float) -> dict:
    """`users` clients, each posting `per_user` questions to /answer; latency, errors, replicas, retries."""
    from serving.client import Client

    def user(u: int) -> list[tuple[float, bool, str, int]]:
        c = Client(url, timeout_s=timeout_s, retries=2)
        out = []
        for j in range(per_user):
            q = questions[(u * per_user + j) % len(questions)]
            t = time.perf_counter()
            try:
                r = c.answer(q, AnswerOptions(max_new_tokens=16))
                out.append((time.perf_counter() - t, bool(r.payload["answer"]), r.replica, r.attempts))
            except Exception as e:  # counted as an error, reported
                print(f"error: {type(e).__name__}: {e}", flush=True)
                out.append((time.perf_counter() - t, False, "", 0))
        return out

    t0 = time.perf_counter()
    with ThreadPoolExecutor(users) as pool:
        results = [x for f in [pool.submit(user, u) for u in range(users)] for x in f.result(timeout=timeout_s)]
    wall = time.perf_counter() - t0
    lat = [r[0] for r in results]
    per_replica: dict[str, int] = {}
    for r in results:
        if r[2]:
            per_replica[r[2]] = per_replica.get(r[2], 0) + 1
    return {
        "users": users,
        "requests": len(results),
        "errors": sum(1 for r in results if not r[1]),
        "retried": sum(1 for r in results if r[3] > 1),
        "wall_s": wall,
        "throughput_rps": len(results) / wall,
        "latency_p50_s": statistics.median(lat),
        "latency_p95_s": pct(lat, 0.95),
        "per_replica": per_replica,
    }


def ray_main(args) -> None:
    """Each replica count in turn, in this one run: deploy, warm every replica, measure, tear down."""
    from serving import launch
    from serving.client import Client

    users = int((args.users or "8").split(",")[0])
    counts = [int(n) for n in args.replicas.split(",")]
    out_path = args.out or (None if args.tiny else str(ROOT / "docs" / "bench" / "serving-ray.json"))
    levels = []
    with tempfile.TemporaryDirectory(prefix="kvgraft-serving-ray-") as tmp:
        questions, base = _seed_store(Path(tmp), args)
        try:
            for n in counts:
                settings = base.with_(replicas=n, port=_free_port())
                t = time.perf_counter()
                url = launch.start(settings, num_cpus=max(counts))
                ready_s = time.perf_counter() - t
                warm = Client(url, timeout_s=args.level_timeout_s)
                with ThreadPoolExecutor(2 * n) as pool:  # each replica answers once before the clock starts
                    list(
                        pool.map(
                            lambda i, c=warm: c.answer(questions[i % len(questions)], AnswerOptions(max_new_tokens=16)),
                            range(2 * n),
                        )
                    )
                level = {"replicas": n, "ready_s": ready_s} | _ray_level(
                    url, questions, users, args.per_user, args.level_timeout_s
                )
                levels.append(level)
                print(json.dumps(level), flush=True)
                launch.stop(shutdown_ray=False)
        finally:
            launch.stop(shutdown_ray=True)
    base_rps = levels[0]["throughput_rps"]
    out = {
        "benchmark": "serving-ray",
        "command": f".venv/bin/python -m bench.serving --ray --replicas {args.replicas}" + (" --tiny" if args.tiny else ""),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "load_avg_1m_at_end": os.getloadavg()[0]},
        "setup": f"{'tiny random' if args.tiny else 'real default'} model, seed library, Ray Serve on one machine, "
        f"{args.threads} torch thread(s) per replica, {users} users x {args.per_user} requests, POST /answer "
        "(retrieval on, check off, max_new_tokens 16), serving.client.Client with its retries, loopback",
        "levels": levels,
        "throughput_ratio_vs_first": [lv["throughput_rps"] / base_rps for lv in levels],
    }
    if out_path:
        Path(out_path).write_text(json.dumps(out, indent=2) + "\n")
    print("\n| replicas | requests | errors | retried | throughput (req/s) | ratio | p50 (s) | p95 (s) | per replica |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for lv, ratio in zip(levels, out["throughput_ratio_vs_first"], strict=True):
        print(
            f"| {lv['replicas']} | {lv['requests']} | {lv['errors']} | {lv['retried']} | {lv['throughput_rps']:.2f} | "
            f"{ratio:.2f} | {lv['latency_p50_s']:.2f} | {lv['latency_p95_s']:.2f} | {sorted(lv['per_replica'].values())} |"
        )


if __name__ == "__main__":
    main()
