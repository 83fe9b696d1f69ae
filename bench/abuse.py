"""The load test against the running web app on loopback: anonymous clients attack while one user chats
through `/chat`. The attacks (`--attack`, one or several, comma-separated):

- `heavy`: N sessions of one address call the heaviest anonymous calls back to back (`/verify` with the most
  samples, own position and relocated; `/answer` with the most decode tokens and k);
- `refused`: N sessions of one address send the admin-only full check and no-graft comparison (refused at once);
- `long`: N sessions of one address send 4,000-character questions (refused past the prompt-token bound);
- `solves`: N sessions of one address flood the trusted-problem solve, each re-sent as soon as it ends;
- `singles`: four addresses, one request at a time each: a verify, a 4,000-character question, a solve, a
  refused check and compare;
- `reads`: N sessions of one address render the dashboard and search the library back to back (the private
  handlers, by fn_index, as the page's timer and search box call them);
- `uploads`: N sessions of one address post 16 MiB files of random bytes to Gradio's upload route back to back,
  without the admin token (the issue's attack: every one was written, 401 MB in seconds);
- `api`: N clients of one address through the OpenAI-compatible API (`/v1`, serving.openai_api), back to back:
  the longest anonymous chat completion, the same streamed as a completion, a 3,960-character question
  (refused past the prompt-token bound) and the admin-only exactness check (refused), one kind per client.

Reports, per attack, the user's chat latency idle and under attack (p50/p95), the errors each side saw, the
attackers' calls and refusals (a refused attacker waits 0.1 s, as a client told to wait would), the server's
resident memory before and after each attack and for the whole run (at its start, its end and once idle for
SETTLE_S, after the heap trimmer ran), and every file that appeared outside the store meanwhile (the temp folder,
Gradio's cache) with those folders' bytes before and after the attack. Bounded: a fixed number of user chats, attackers stop when the user is done, a deadline on all.

Usage: .venv/bin/python -m bench.abuse [--tiny] [--chats 20] [--attackers 8] [--attack heavy,long,solves]
[--home DIR]   (real model by default, the built-in seed library, seeded into a scratch store unless --home
names an already seeded one; writes docs/bench/abuse.json with --write)
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
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUESTION = "Who founded the town of Velmora?"
ATTACK_QUESTION = "Tell me everything about the town of Velmora, its founder, its history and its people."
LONG_QUESTION = (ATTACK_QUESTION + " ") * 44  # 3,960 characters, under the 4,000-character bound
REFUSED = (
    "One request at a time",
    "Too many requests in flight",
    "needs the admin token",
    "Your address already has",
    "prompt tokens; the limit without the admin token",
    "Too many requests from your address",  # the rate limiter's 429, as the raw join reports it
    "429 Too Many Requests",  # the same, as gradio_client reports it
    "Uploads need the admin",  # the upload door's 403
    "api refused",  # the OpenAI-compatible API's 429 / 400 / 403 for a bound or the admin's work (`_api`)
)
ATTACKS = ("heavy", "refused", "long", "solves", "singles", "reads", "uploads", "api")
UPLOAD_BYTES = 16 * 2**20
SINGLES = ("verify", "long", "solve", "refused")  # one address each
REFUSED_WAIT_S = 0.1
SETTLE_S = 25.0  # after the last run, idle this long (the trimmer looks every 10 s) before the settled RSS


def rss_mb() -> float:
    """This process's resident memory in MB (the server runs in it)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))] if xs else float("nan")


def files_under(folders: list[Path]) -> set[str]:
    return {str(p) for f in folders if f.exists() for p in f.rglob("*") if p.is_file()}


def bytes_under(folders: list[Path]) -> int:
    """What the files under `folders` hold, measured (a file removed meanwhile counts nothing)."""
    total = 0
    for p in files_under(folders):
        try:
            total += os.stat(p).st_size
        except OSError:
            pass
    return total


@dataclass(frozen=True)
class AbuseReport:
    chats: int
    attackers: int
    idle_s: tuple[float, ...]
    loaded_s: tuple[float, ...]
    user_errors: tuple[str, ...]
    attacker_calls: int
    attacker_errors: tuple[str, ...]  # anything but a clean refusal
    attacker_refusals: int  # requests refused at once (over a quota or a bound, or admin-only)
    outside_files: tuple[str, ...]  # new files outside the store while the attack ran
    attack: str = "heavy"
    rss_mb: tuple[float, float] = (float("nan"), float("nan"))  # the server's resident memory before / after
    temp_bytes: tuple[int, int] = (0, 0)  # the watched folders' bytes before / after the attack

    @property
    def bytes_written(self) -> int:
        """What the attack left in the temp folders: their growth while it ran (0 when they shrank)."""
        return max(0, self.temp_bytes[1] - self.temp_bytes[0])

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
            bytes_written=self.bytes_written,
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


def _raw(url: str, fn_index: int, data: list, address: str) -> None:
    """One call of a private handler (the solve tab's) by fn_index through /gradio_api/queue/join, as a script
    ignoring the API docs would; RuntimeError with the refusal or the error message."""
    import httpx

    session, headers = uuid.uuid4().hex, {"X-Forwarded-For": address}
    base = url.rstrip("/") + "/gradio_api"
    body = {"data": data, "fn_index": fn_index, "session_hash": session, "event_data": None, "trigger_id": None}
    r = httpx.post(f"{base}/queue/join", json=body, headers=headers, timeout=60)
    if r.status_code != 200:
        raise RuntimeError(f"join refused ({r.status_code}): {r.text[:300]}")
    with httpx.stream("GET", f"{base}/queue/data", params={"session_hash": session}, headers=headers, timeout=600) as s:
        for line in s.iter_lines():
            if line.startswith("data:"):
                msg = json.loads(line[5:])
                if msg.get("msg") == "process_completed":
                    if not msg.get("success"):
                        raise RuntimeError(str((msg.get("output") or {}).get("error")))
                    return


def _upload(url: str, address: str, data: bytes) -> None:
    """One anonymous upload of `data` to Gradio's upload route; RuntimeError with the answer unless it was kept."""
    import httpx

    r = httpx.post(
        url.rstrip("/") + "/gradio_api/upload",
        files={"files": ("attack.bin", data)},
        headers={"X-Forwarded-For": address},
        timeout=120,
    )
    if r.status_code != 200:
        raise RuntimeError(f"upload answered {r.status_code}: {r.text[:200]}")


def _api(url: str, address: str, route: str, body: dict) -> None:
    """One anonymous request to the OpenAI-compatible API (a stream read to its end); RuntimeError("api refused
    ...") for a refusal the API says the caller can act on (429, a bound's 400, the admin's 403), else for any
    other answer than a completed one."""
    import httpx

    headers = {"X-Forwarded-For": address}
    with httpx.stream("POST", url.rstrip("/") + route, json=body, headers=headers, timeout=600) as r:
        text = r.read().decode()
    refused = r.status_code in (403, 429) or (r.status_code == 400 and "the limit without the admin token" in text)
    if refused:
        raise RuntimeError(f"api refused ({r.status_code}): {text[:200]}")
    if r.status_code != 200 or (body.get("stream") and not text.rstrip().endswith("data: [DONE]")) or '"error"' in text:
        raise RuntimeError(f"api answered {r.status_code}: {text[:300]}")


def _calls(c, url: str, kind: str, i: int, address: str, solve: tuple[int, str] | None, reads=None) -> Callable[[], object]:
    """The request one attacker of `kind` sends back to back."""
    if kind == "heavy":
        return [
            lambda: c.predict(5, None, api_name="/verify"),
            lambda: c.predict(ATTACK_QUESTION, 16, True, 32, False, False, api_name="/answer"),
            lambda: c.predict(5, 64, api_name="/verify"),
            lambda: c.predict(ATTACK_QUESTION[::-1], 16, True, 32, False, False, api_name="/answer"),
        ][i % 4]
    if kind == "refused":
        return lambda: c.predict(ATTACK_QUESTION, 16, True, 16, True, True, api_name="/answer")
    if kind in ("long", "verify"):
        if kind == "verify":
            return lambda: c.predict(5, None, api_name="/verify")
        return lambda: c.predict(LONG_QUESTION, 16, True, 32, False, False, api_name="/answer")
    if kind in ("solves", "solve"):
        assert solve is not None, "a solve attack needs the solve handler's fn_index and a trusted problem"
        index, problem = solve
        return lambda: _raw(url, index, [problem, 1024, i], address)
    if kind == "reads":
        assert reads is not None, "a reads attack needs the dashboard's and the library search's fn_index"
        dashboard, search = reads
        return [lambda: _raw(url, dashboard, [], address), lambda: _raw(url, search, ["the"], address)][i % 2]
    if kind == "api":
        chat = {"model": "kvgraft", "max_tokens": 32, "messages": [{"role": "user", "content": ATTACK_QUESTION}]}
        return [
            lambda: _api(url, address, "/v1/chat/completions", chat),
            lambda: _api(
                url, address, "/v1/completions", {"model": "kvgraft", "prompt": ATTACK_QUESTION, "max_tokens": 32, "stream": True}
            ),
            lambda: _api(url, address, "/v1/chat/completions", chat | {"messages": [{"role": "user", "content": LONG_QUESTION}]}),
            lambda: _api(url, address, "/v1/chat/completions", chat | {"kvgraft": {"check": True}}),
        ][i % 4]
    if kind == "uploads":
        data = os.urandom(UPLOAD_BYTES)  # one file per session, random (no deduplication by content helps)
        return lambda: _upload(url, address, data)
    raise ValueError(f"unknown attack {kind!r}; valid: {', '.join(ATTACKS)}")


def _attacker(c, call, stop, deadline: float, out: dict) -> None:
    """One anonymous client sending `call` back to back until `stop`; a refusal waits REFUSED_WAIT_S."""
    while not stop.is_set() and time.monotonic() < deadline:
        try:
            call()
            out["calls"] += 1
        except Exception as exc:
            out["calls"] += 1
            message = str(exc)
            if any(r in message for r in REFUSED):
                out["refusals"] += 1
                time.sleep(REFUSED_WAIT_S)
            else:
                out["errors"].append(f"{type(exc).__name__}: {message}"[:300])


def _attack(url: str, attackers: int, ready, stop, deadline: float, results, kind: str, solve=None, reads=None) -> None:
    """The attacking hosts, in their own process (their client threads do not share the server's GIL): `attackers`
    sessions of one address, or with `singles` one session at each of four addresses. The process runs at the
    lowest priority: on a deployment the attackers' clients run on their own hosts, so what their own client code
    costs (HTTP, JSON, threads) must not be taken from the server here; what the server spends on them is."""
    os.nice(19)
    if kind == "singles":
        who = [(k, f"203.0.113.{20 + n}") for n, k in enumerate(SINGLES)]
    else:
        who = [(kind, ATTACKER_ADDRESS)] * attackers
    outs = [{"calls": 0, "refusals": 0, "errors": []} for _ in who]
    with ThreadPoolExecutor(len(who)) as pool:
        clients = list(pool.map(lambda w: _client(url, w[1]), who))
        calls = [_calls(clients[i], url, k, i, a, solve, reads) for i, (k, a) in enumerate(who)]
        ready.set()
        for f in [pool.submit(_attacker, clients[i], calls[i], stop, deadline, outs[i]) for i in range(len(who))]:
            f.result()
    results.put(outs)


def run(
    url: str,
    chats: int = 20,
    attackers: int = 8,
    watch: tuple[Path, ...] = (),
    deadline_s: float = 900.0,
    refused: bool = False,
    attack: str = "heavy",
    solve: tuple[int, str] | None = None,
    idle: list[float] | None = None,
    reads: tuple[int, int] | None = None,
) -> AbuseReport:
    """Idle chats (unless `idle` hands over times already measured), then the same number of chats while the
    `attack` runs (`refused=True` is `attack="refused"`; `solve` = the solve handler's fn_index and a trusted
    problem, for the solve attacks). The server must believe X-Forwarded-For from 127.0.0.1 (`web.app.serve`
    with that proxy, KVGRAFT_TRUST_PROXY=127.0.0.1) to tell the hosts apart on loopback; otherwise all share
    one address."""
    attack = "refused" if refused else attack
    deadline = time.monotonic() + deadline_s
    user_errors: list[str] = []
    if idle is None:
        _user(url, 2, QUESTION, user_errors)  # warm-up, not counted
        idle = _user(url, chats, QUESTION, user_errors)
    before, rss_before, bytes_before = files_under(list(watch)), rss_mb(), bytes_under(list(watch))
    ctx = multiprocessing.get_context("spawn")
    ready, stop, results = ctx.Event(), ctx.Event(), ctx.Queue()
    args = (url, attackers, ready, stop, deadline, results, attack, solve, reads)
    host = ctx.Process(target=_attack, args=args, daemon=True)
    host.start()
    try:
        ready.wait(timeout=120)  # every attacker connected
        time.sleep(2.0)  # and hammering
        loaded = _user(url, chats, QUESTION, user_errors)
    finally:
        stop.set()
        outs = results.get(timeout=max(5.0, deadline - time.monotonic()))
        host.join(timeout=30)
    after, bytes_after = files_under(list(watch)), bytes_under(list(watch))
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
        attack=attack,
        rss_mb=(round(rss_before, 1), round(rss_mb(), 1)),
        temp_bytes=(bytes_before, bytes_after),
    )


def seed_tiny(lib) -> None:
    """The seed library's texts, attested (a tiny random model cannot pass the items' verifiers)."""
    from services import seed

    items, sheets = seed.seed_items()
    for it in items:
        lib.deposit_text(f"{it['question']} {it['solution']}", title=it["question"], attested_by="bench.abuse", admin=True)
    for title, text in sheets:
        lib.deposit_text(text[:1500], title=title, attested_by="bench.abuse", admin=True)


def _reads_targets(demo) -> tuple[int, int] | None:
    """The fn_index of the dashboard's render (its outputs start with the stats panel) and of the library search
    (the search box's submit), for the reads attack."""
    dashboard = [
        i for i, f in demo.fns.items() if f.outputs and getattr(f.outputs[0], "elem_id", None) == "kv-stats" and not f.inputs
    ]
    search = [
        i
        for i, f in demo.fns.items()
        if len(f.inputs) == 1 and getattr(f.inputs[0], "placeholder", None) == "search titles and text" and f.outputs
    ]
    return (dashboard[0], search[0]) if dashboard and search else None


def _solve_target(demo) -> tuple[int, str] | None:
    """The solve tab's anonymous handler (fn_index) and the first trusted problem, for the solve attacks."""
    from web.solve_tab import trusted_problems

    index = [i for i, f in demo.fns.items() if f.name == "solve_public"]
    problems = list(trusted_problems(ROOT / "datasets" / "problems.jsonl"))
    return (index[0], problems[0]) if index and problems else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="a tiny random model and the hash embedder (seconds, not figures)")
    ap.add_argument("--chats", type=int, default=20)
    ap.add_argument("--attackers", default="8", help="sessions of the attacking address, comma-separated for several runs")
    ap.add_argument("--attack", default="heavy", help=f"comma-separated, each run in turn: {', '.join(ATTACKS)}")
    ap.add_argument("--write", action="store_true", help="write docs/bench/abuse.json (--out names another file)")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "bench" / "abuse.json", help="where --write writes")
    ap.add_argument("--home", type=Path, help="an already seeded store to use (the real model's seeding takes minutes)")
    ap.add_argument("--refused", action="store_true", help="the same as --attack refused")
    ap.add_argument("--deadline", type=float, default=900.0, help="seconds after which the attackers of one run stop")
    args = ap.parse_args()
    attacks = ["refused"] if args.refused else [a.strip() for a in args.attack.split(",") if a.strip()]
    bad = [a for a in attacks if a not in ATTACKS]
    if bad:
        ap.error(f"unknown attack {bad[0]!r}; valid: {', '.join(ATTACKS)}")
    counts = [int(n) for n in args.attackers.split(",")]
    scratch = Path(tempfile.mkdtemp(prefix="kvgraft-abuse-"))
    os.environ["GRADIO_TEMP_DIR"] = str(scratch / "gradio")
    tempfile.tempdir = str(scratch / "tmp")
    (scratch / "tmp").mkdir()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import server
    import services
    from services import seed
    from web import hosting, memory

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
    memory.start_trimmer()  # as server.main does: freed activations go back to the OS
    demo = server.build(lib, admin_token="abuse-admin")  # the app's own guard: its slots, per-address share and depth
    where = replace(hosting.detect({}), port=free_port(), proxies=("127.0.0.1/32",))  # a proxy on loopback
    server.serve(demo, where, prevent_thread_lock=True, quiet=True)
    runs, idle = [], None
    try:
        load = os.getloadavg()[0]
        rss_start = rss_mb()
        watch = (scratch / "gradio", scratch / "tmp")
        for attack in attacks:
            for n in [4] if attack == "singles" else counts:
                kw = dict(watch=watch, deadline_s=args.deadline, attack=attack, solve=_solve_target(demo), idle=idle)
                kw["reads"] = _reads_targets(demo)
                rep = run(demo.local_url, args.chats, n, **kw)
                idle = list(rep.idle_s)  # measured once, before the first attack
                out = {k: v for k, v in rep.to_json().items() if k != "attacker_errors"}
                out.update(attacker_error_count=len(rep.attacker_errors), attacker_errors=sorted(set(rep.attacker_errors))[:5])
                runs.append(out)
                print(
                    json.dumps(
                        {
                            k: out[k]
                            for k in (
                                "attack",
                                "attackers",
                                "idle_p50",
                                "idle_p95",
                                "loaded_p50",
                                "loaded_p95",
                                "user_errors",
                                "attacker_calls",
                                "attacker_refusals",
                                "bytes_written",
                                "rss_mb",
                            )
                        }
                    )
                )
        rss_end = rss_mb()
        time.sleep(SETTLE_S)  # idle: what the server still holds once its trimmer has run
        rss_settled = rss_mb()
    finally:
        demo.close()
    out = dict(
        runs=runs,
        rss_mb={"start": round(rss_start, 1), "end": round(rss_end, 1), "settled": round(rss_settled, 1), "settle_s": SETTLE_S},
        model="tiny" if args.tiny else "default",
        date=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        load_average=[round(load, 1), round(os.getloadavg()[0], 1)],  # 1-minute load before / after, this machine
        cpus=os.cpu_count(),
    )
    print(json.dumps(out, indent=1))
    if args.write:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
