"""Decode throughput of several sessions stepped together (graft_core.batch) against one after another.

Real model, 2 threads. For 1, 2, 4 and 8 sessions (caches of different lengths, some past the
512-token window, made by prefilling seeded random tokens), greedy-decode `--steps` tokens per
session two ways, alternating per repeat: each session's step alone (`forward_chunk`, what an answer
does today) and all sessions' steps in one `Batcher.step` pass. Reports decode tokens per second both
ways and their ratio (medians), and whether every logits row and every final cache was byte-equal
between the two ways (compared as SHA-256 over the bytes, per session). Then the same for the prompt
forwards: each session's question-sized prompt (PROMPTS tokens) alone, against all of them stacked in
`Batcher.prefill` passes, last rows and caches compared the same way. Then a round as serving meets it
most: one answer's prompt arriving while the other sessions decode, run as two passes (the prompt alone,
then the steps together) against one `Batcher.run` pass taking both. The web app uses all three through
`StepGroup` (README, "Serving"). Last, where one pass of the most sessions spends its time (`pass_parts`:
the products (fma16's, or MKL's padded column products where fma16 does not run), the vocabulary's
among them, the attention calls and the cache updates, timed inside the pass) and MKL's padded column
product of the vocabulary alone at each width (what the MKL path would pay; not used under fma16).

    .venv/bin/python -m bench.batch [--steps 8] [--repeats 3] [--sessions 1,2,4,8]

Writes docs/bench/batch.json and prints a table.
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import hashlib
import json
import os
import platform
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LENGTHS = (40, 700, 130, 560, 60, 300, 90, 1200)  # prefix tokens per session, in order of joining
PROMPTS = (16, 13, 20, 17, 33, 14, 24, 12)  # prompt tokens per session (a question and its template)


def _digest(rows, cache) -> str:
    h = hashlib.sha256()
    for r in rows:
        h.update(r.numpy().tobytes())
    for layer in cache.layers:
        h.update(layer.keys.numpy().tobytes())
        h.update(layer.values.numpy().tobytes())
    return h.hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sessions", default="1,2,4,8")
    ap.add_argument("--out", default=str(ROOT / "docs" / "bench" / "batch.json"))
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from bench.kernels import timed
    from graft_core import batch, fma16
    from graft_core.forward import forward_chunk, new_cache
    from graft_core.model import load

    lm = load()
    m = lm.model
    t = time.perf_counter()
    b = batch.Batcher(m)
    build_s = time.perf_counter() - t
    print(f"batcher: widths {b.widths} ({b.why or 'checked'}), built in {build_s:.2f} s", flush=True)
    gen = torch.Generator().manual_seed(0)
    caches = []
    for n in LENGTHS:
        cache = new_cache(m)
        forward_chunk(m, cache, torch.randint(3, m.config.vocab_size, (n,), generator=gen).tolist(), 0)
        caches.append(cache)

    def alone(k: int):
        cs = [copy.deepcopy(c) for c in caches[:k]]
        toks, pos, rows = [7 + i for i in range(k)], list(LENGTHS[:k]), [[] for _ in range(k)]
        t = time.perf_counter()
        for _ in range(args.steps):
            for i in range(k):
                r = forward_chunk(m, cs[i], [toks[i]], pos[i])[-1]
                rows[i].append(r)
                toks[i], pos[i] = int(torch.argmax(r)), pos[i] + 1
        return time.perf_counter() - t, [_digest(rows[i], cs[i]) for i in range(k)]

    def together(k: int):
        cs = [copy.deepcopy(c) for c in caches[:k]]
        toks, pos, rows = [7 + i for i in range(k)], list(LENGTHS[:k]), [[] for _ in range(k)]
        t = time.perf_counter()
        for _ in range(args.steps):
            out = b.step([batch.Session(cs[i], toks[i], pos[i]) for i in range(k)])
            for i, r in enumerate(out):
                rows[i].append(r)
                toks[i], pos[i] = int(torch.argmax(r)), pos[i] + 1
        return time.perf_counter() - t, [_digest(rows[i], cs[i]) for i in range(k)]

    def prompts(k: int, stacked: bool):
        cs = [copy.deepcopy(c) for c in caches[:k]]
        ids = [
            torch.randint(3, m.config.vocab_size, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in PROMPTS[:k]
        ]
        t = time.perf_counter()
        if stacked:
            rows = b.prefill([(cs[i], ids[i], LENGTHS[i]) for i in range(k)])
        else:
            rows = [forward_chunk(m, cs[i], ids[i], LENGTHS[i])[-1] for i in range(k)]
        return time.perf_counter() - t, [_digest([rows[i]], cs[i]) for i in range(k)]

    def arriving(k: int, one_pass: bool):
        """Sessions 0..k-2 take a decode step while session k-1's prompt arrives."""
        cs = [copy.deepcopy(c) for c in caches[:k]]
        n = PROMPTS[k - 1]
        ids = torch.randint(3, m.config.vocab_size, (n,), generator=torch.Generator().manual_seed(n)).tolist()
        prompt, steps = [(cs[k - 1], ids, LENGTHS[k - 1])], [batch.Session(cs[i], 7 + i, LENGTHS[i]) for i in range(k - 1)]
        t = time.perf_counter()
        if one_pass:
            prompt_rows, step_rows = b.run(prompt, steps)
        else:
            prompt_rows, step_rows = b.prefill(prompt), b.step(steps)
        rows = step_rows + prompt_rows
        return time.perf_counter() - t, [_digest([rows[i]], cs[i]) for i in range(k)]

    def pass_parts(k: int) -> dict:
        """One k-session step pass timed whole (median of repeats), then once more with its parts timed."""
        from collections import defaultdict

        from transformers.models.gemma3 import modeling_gemma3 as g3

        def one() -> float:
            cs = [copy.deepcopy(c) for c in caches[:k]]
            sessions = [batch.Session(cs[i], 7 + i, LENGTHS[i]) for i in range(k)]
            t = time.perf_counter()
            b.step(sessions)
            return time.perf_counter() - t

        whole = statistics.median([one() for _ in range(args.repeats)])
        parts: dict[str, float] = defaultdict(float)
        undo = []

        def timing(obj, name: str, key) -> None:
            orig = getattr(obj, name)

            def timed_call(*a, **kw):
                t = time.perf_counter()
                try:
                    return orig(*a, **kw)
                finally:
                    parts[key(a) if callable(key) else key] += time.perf_counter() - t

            setattr(obj, name, timed_call)
            undo.append((obj, name, orig, name in vars(obj)))

        vocab = tuple(m.lm_head.weight.shape)
        timing(batch, "column_product", lambda a: "vocabulary" if tuple(a[0].shape) == vocab else "layer_products")
        timing(fma16, "linear", lambda a: "vocabulary" if a[3] == vocab[0] else "layer_products")  # (x, w, fmt, n)
        for cls in {type(layer) for c in caches[:k] for layer in c.layers}:
            timing(cls, "update", "cache_updates")
        registry = g3.ALL_ATTENTION_FUNCTIONS
        real_get = registry.get_interface
        undo.append((registry, "get_interface", real_get, False))

        def get_interface(*a, **kw):
            fn = real_get(*a, **kw)

            def attention(*x, **y):
                t = time.perf_counter()
                try:
                    return fn(*x, **y)
                finally:
                    parts["attention"] += time.perf_counter() - t

            return attention

        registry.get_interface = get_interface
        try:
            timed_whole = one()
        finally:
            for obj, name, orig, own in reversed(undo):
                if own:
                    setattr(obj, name, orig)
                else:
                    delattr(obj, name)
        out = {k_: round(1000 * v, 1) for k_, v in parts.items()}
        out["rest"] = round(1000 * timed_whole - sum(out.values()), 1)
        x = torch.randn(max(b.widths), m.config.hidden_size, generator=torch.Generator().manual_seed(9))
        widths = {
            str(w): round(
                1000
                * statistics.median(timed(lambda w=w: batch.column_product(m.lm_head.weight, x[:w], w), max(3, args.repeats))),
                1,
            )
            for w in b.widths
        }
        return {
            "sessions": k,
            "pass_ms": round(1000 * whole, 1),
            "timed_pass_ms": round(1000 * timed_whole, 1),
            "parts_ms": out,
            "vocabulary_columns_ms": widths,
        }

    levels = []
    for k in [int(x) for x in args.sessions.split(",")]:
        if k > len(LENGTHS):
            raise SystemExit(f"at most {len(LENGTHS)} sessions")
        ta, tt, same = [], [], True
        for _ in range(args.repeats):  # alternating, the machine drifts
            sa, da = alone(k)
            st, dt_ = together(k)
            ta.append(sa)
            tt.append(st)
            same &= da == dt_
        pa, pt, psame = [], [], True
        for _ in range(args.repeats):
            sa, da = prompts(k, False)
            st, dt_ = prompts(k, True)
            pa.append(sa)
            pt.append(st)
            psame &= da == dt_
        ma, mt, msame = [], [], True
        for _ in range(args.repeats if k > 1 else 0):
            sa, da = arriving(k, False)
            st, dt_ = arriving(k, True)
            ma.append(sa)
            mt.append(st)
            msame &= da == dt_
        tokens = k * args.steps
        level = {
            "sessions": k,
            "decode_tokens": tokens,
            "alone_s": statistics.median(ta),
            "together_s": statistics.median(tt),
            "alone_tokens_per_s": tokens / statistics.median(ta),
            "together_tokens_per_s": tokens / statistics.median(tt),
            "ratio": statistics.median(ta) / statistics.median(tt),
            "rows_and_caches_byte_equal": same,
            "prompt_tokens": sum(PROMPTS[:k]),
            "prompts_alone_s": statistics.median(pa),
            "prompts_stacked_s": statistics.median(pt),
            "prompts_ratio": statistics.median(pa) / statistics.median(pt),
            "prompt_rows_and_caches_byte_equal": psame,
        }
        if ma:
            level |= {
                "arriving_two_passes_s": statistics.median(ma),
                "arriving_one_pass_s": statistics.median(mt),
                "arriving_ratio": statistics.median(ma) / statistics.median(mt),
                "arriving_rows_and_caches_byte_equal": msame,
            }
        levels.append(level)
        print(json.dumps(level), flush=True)
    parts = pass_parts(max(int(x) for x in args.sessions.split(","))) if b.widths else None
    print(json.dumps({"pass_parts": parts}), flush=True)
    doc = {
        "benchmark": "batch",
        "command": f".venv/bin/python -m bench.batch --steps {args.steps} --repeats {args.repeats} --sessions {args.sessions}",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_avg_after": os.getloadavg()},
        "model_fingerprint": lm.fingerprint,
        "products": lm.products,
        "widths": list(b.widths),
        "stacked_sizes": len(b.stack_sizes),
        "prompt_tokens": list(PROMPTS),
        "batcher_build_s": build_s,
        "prefix_tokens": list(LENGTHS),
        "levels": levels,
        "pass_parts": parts,
    }
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(
        "\n| sessions | decode tokens/s alone / together | ratio | prompts alone / stacked (s) | ratio "
        "| a prompt arriving during k-1 steps: two passes / one (s) | ratio | rows and caches byte-equal |"
        "\n|---:|---:|---:|---:|---:|---:|---:|---|"
    )
    for lv in levels:
        same = lv["rows_and_caches_byte_equal"] and lv["prompt_rows_and_caches_byte_equal"]
        same &= lv.get("arriving_rows_and_caches_byte_equal", True)
        arriving = (
            f"{lv['arriving_two_passes_s']:.3f} / {lv['arriving_one_pass_s']:.3f} | {lv['arriving_ratio']:.2f}x"
            if "arriving_ratio" in lv
            else "- | -"
        )
        print(
            f"| {lv['sessions']} | {lv['alone_tokens_per_s']:.1f} / {lv['together_tokens_per_s']:.1f} | {lv['ratio']:.2f}x | "
            f"{lv['prompts_alone_s']:.3f} / {lv['prompts_stacked_s']:.3f} | {lv['prompts_ratio']:.2f}x | {arriving} | "
            f"{'yes' if same else 'NO'} |"
        )
    if parts:
        print(
            f"\none pass of {parts['sessions']} steps: {parts['pass_ms']} ms (timed in parts: {parts['parts_ms']}); "
            f"the vocabulary's padded column product alone by width: {parts['vocabulary_columns_ms']} ms"
        )


if __name__ == "__main__":
    main()
