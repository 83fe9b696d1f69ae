"""The load test against the running web app on loopback: 8 anonymous clients hammer the heaviest
anonymous calls (`/verify` with the most samples allowed, own position and relocated; `/answer` with the
most decode tokens and k allowed; the full check and the no-graft comparison are admin-only, so an attacker
asking for them is refused at once, which `--refused` measures) while one user chats through `/chat`.

Reports the user's chat latency idle and under attack (p50/p95), the errors each side saw, the attackers'
calls and refusals, and every file that appeared outside the store meanwhile (the temp folder, Gradio's
cache). Bounded: a fixed number of user chats, attackers stop when the user is done, a deadline on all.

Usage: .venv/bin/python -m bench.abuse [--tiny] [--chats 20] [--attackers 8] [--home DIR]   (real model by
default, the built-in seed library, seeded into a scratch store unless --home names an already seeded one;
writes docs/bench/abuse.json with --write)
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing
import os
import socket
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUESTION = "Who founded the town of Velmora?"
ATTACK_QUESTION = "Tell me everything about the town of Velmora, its founder, its history and its people."
REFUSED = ("One request at a time", "Too many requests in flight", "needs the admin token")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))] if xs else float("nan")


def files_under(folders: list[Path]) -> set[str]:
    return {str(p) for f in folders if f.exists() for p in f.rglob("*") if p.is_file()}


@dataclass(frozen=True)
class AbuseReport:
    chats: int
    attackers: int
    idle_s: tuple[float, ...]
    loaded_s: tuple[float, ...]
    user_errors: tuple[str, ...]
    attacker_calls: int
    attacker_errors: tuple[str, ...]  # anything but a clean refusal
    attacker_refusals: int  # over-quota requests refused at once (expected zero here: one call at a time each)
    outside_files: tuple[str, ...]  # new files outside the store while the attack ran

    @property
    def idle_p95(self) -> float:
        return pct(list(self.idle_s), 0.95)

    @property
    def loaded_p95(self) -> float:
        return pct(list(self.loaded_s), 0.95)

    @property
    def ratio(self) -> float:
        return self.loaded_p95 / self.idle_p95

    def to_json(self) -> dict:
        out = asdict(self)
        out.update(
            idle_p50=pct(list(self.idle_s), 0.5),
            idle_p95=self.idle_p95,
            loaded_p50=pct(list(self.loaded_s), 0.5),
            loaded_p95=self.loaded_p95,
            ratio_p95=self.ratio,
        )
        return out


def _chat(client, question: str) -> float:
    t0 = time.perf_counter()
    history, _evidence, _box = client.predict(question, [], True, 3, 32, False, False, "", api_name="/chat")
    elapsed = time.perf_counter() - t0
    last = history[-1]["content"] if history else ""
    text = last if isinstance(last, str) else "".join(p.get("text", "") for p in last if isinstance(p, dict))
    if not history or "Not answered" in text or "⚠" in text:
        raise RuntimeError(f"chat not answered: {text[:200]}")
    return elapsed


USER_ADDRESS = "198.51.100.2"  # documentation addresses (RFC 5737), sent as X-Forwarded-For
ATTACKER_ADDRESS = "203.0.113.7"


def _client(url: str, address: str):
    from gradio_client import Client

    return Client(url, verbose=False, headers={"X-Forwarded-For": address})


def _user(url: str, n: int, question: str, errors: list[str]) -> list[float]:
    c = _client(url, USER_ADDRESS)
    times = []
    for _ in range(n):
        try:
            times.append(_chat(c, question))
        except Exception as exc:  # counted, reported
            errors.append(f"{type(exc).__name__}: {exc}"[:300])
    return times


def _attacker(c, i: int, stop, deadline: float, out: dict, refused: bool = False) -> None:
    """One anonymous client calling its heaviest allowed request back to back until `stop` (with `refused`,
    the admin-only full check and comparison instead: refused at once, back to back)."""
    calls = [
        lambda: c.predict(5, None, api_name="/verify"),
        lambda: c.predict(ATTACK_QUESTION, 16, True, 32, False, False, api_name="/answer"),
        lambda: c.predict(5, 64, api_name="/verify"),
        lambda: c.predict(ATTACK_QUESTION[::-1], 16, True, 32, False, False, api_name="/answer"),
    ]
    if refused:
        calls = [lambda: c.predict(ATTACK_QUESTION, 16, True, 16, True, True, api_name="/answer")]
    call = calls[i % len(calls)]
    while not stop.is_set() and time.monotonic() < deadline:
        try:
            call()
            out["calls"] += 1
        except Exception as exc:
            out["calls"] += 1
            message = str(exc)
            if any(r in message for r in REFUSED):
                out["refusals"] += 1
            else:
                out["errors"].append(f"{type(exc).__name__}: {message}"[:300])


def _attack(url: str, attackers: int, ready, stop, deadline: float, results, refused: bool = False) -> None:
    """The attacking host, in its own process (its client threads do not share the server's GIL)."""
    outs = [{"calls": 0, "refusals": 0, "errors": []} for _ in range(attackers)]
    with ThreadPoolExecutor(attackers) as pool:
        clients = list(pool.map(lambda _: _client(url, ATTACKER_ADDRESS), range(attackers)))
        ready.set()
        for f in [pool.submit(_attacker, clients[i], i, stop, deadline, outs[i], refused) for i in range(attackers)]:
            f.result()
    results.put(outs)


def run(
    url: str,
    chats: int = 20,
    attackers: int = 8,
    watch: tuple[Path, ...] = (),
    deadline_s: float = 900.0,
    refused: bool = False,
) -> AbuseReport:
    """Idle chats, then the same number of chats while `attackers` anonymous clients of one other host
    hammer the app (with `refused`: with admin-only requests, refused at once). The server must believe X-Forwarded-For from 127.0.0.1 (`web.app.serve` with
    that proxy, KVGRAFT_TRUST_PROXY=127.0.0.1) to tell the two hosts apart on loopback; otherwise all share one address."""
    deadline = time.monotonic() + deadline_s
    user_errors: list[str] = []
    _user(url, 2, QUESTION, user_errors)  # warm-up, not counted
    idle = _user(url, chats, QUESTION, user_errors)
    before = files_under(list(watch))
    ctx = multiprocessing.get_context("spawn")
    ready, stop, results = ctx.Event(), ctx.Event(), ctx.Queue()
    host = ctx.Process(target=_attack, args=(url, attackers, ready, stop, deadline, results, refused), daemon=True)
    host.start()
    try:
        ready.wait(timeout=120)  # every attacker connected
        time.sleep(2.0)  # and hammering
        loaded = _user(url, chats, QUESTION, user_errors)
    finally:
        stop.set()
        outs = results.get(timeout=max(5.0, deadline - time.monotonic()))
        host.join(timeout=30)
    after = files_under(list(watch))
    return AbuseReport(
        chats=chats,
        attackers=attackers,
        idle_s=tuple(idle),
        loaded_s=tuple(loaded),
        user_errors=tuple(user_errors),
        attacker_calls=sum(o["calls"] for o in outs),
        attacker_errors=tuple(e for o in outs for e in o["errors"]),
        attacker_refusals=sum(o["refusals"] for o in outs),
        outside_files=tuple(sorted(after - before)),
    )


def seed_tiny(lib) -> None:
    """The seed library's texts, attested (a tiny random model cannot pass the items' verifiers)."""
    from services import seed

    items, sheets = seed.seed_items()
    for it in items:
        lib.deposit_text(f"{it['question']} {it['solution']}", title=it["question"], attested_by="bench.abuse", admin=True)
    for title, text in sheets:
        lib.deposit_text(text[:1500], title=title, attested_by="bench.abuse", admin=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="a tiny random model and the hash embedder (seconds, not figures)")
    ap.add_argument("--chats", type=int, default=20)
    ap.add_argument("--attackers", type=int, default=8)
    ap.add_argument("--write", action="store_true", help="write docs/bench/abuse.json")
    ap.add_argument("--home", type=Path, help="an already seeded store to use (the real model's seeding takes minutes)")
    ap.add_argument("--refused", action="store_true", help="attackers send admin-only requests (refused at once)")
    ap.add_argument("--deadline", type=float, default=900.0, help="seconds after which the attackers stop")
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="kvgraft-abuse-"))
    os.environ["GRADIO_TEMP_DIR"] = str(scratch / "gradio")
    tempfile.tempdir = str(scratch / "tmp")
    (scratch / "tmp").mkdir()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import services
    from services import seed
    from web import app, hosting
    from web.guard import Guard

    if args.tiny:
        from graft_core import model as model_mod
        from graft_core import tiny
        from retrieval import HashEmbedder

        folder = tiny.build("gemma3", scratch / "tiny")
        lib = services.Library(home=scratch / "home", lm=model_mod.load(str(folder)), embedder=HashEmbedder())
        seed_tiny(lib)
    else:
        lib = services.Library(home=args.home or scratch / "home")
        if not lib.count():
            seed.seed_library(lib)
    demo = app.build_app(lib, admin_token="abuse-admin", guard=Guard("abuse-admin"))
    where = replace(hosting.detect({}), port=free_port(), proxies=("127.0.0.1/32",))  # a proxy on loopback
    app.serve(demo, where, prevent_thread_lock=True, quiet=True)
    try:
        load = os.getloadavg()[0]
        watch = (scratch / "gradio", scratch / "tmp")
        rep = run(demo.local_url, args.chats, args.attackers, watch=watch, deadline_s=args.deadline, refused=args.refused)
    finally:
        demo.close()
    out = rep.to_json()
    out.update(
        model="tiny" if args.tiny else "default",
        attack="admin-only requests (refused)" if args.refused else "heaviest anonymous requests",
        date=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        load_average=[round(load, 1), round(os.getloadavg()[0], 1)],  # 1-minute load before / after, this machine
        cpus=os.cpu_count(),
    )
    print(json.dumps(out, indent=1))
    if args.write:
        (ROOT / "docs" / "bench").mkdir(parents=True, exist_ok=True)
        (ROOT / "docs" / "bench" / "abuse.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
