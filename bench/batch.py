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
from dataclasses import dataclass
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


@dataclass(frozen=True)
class _Rig:
    """What every measurement starts from: the model, its batcher and one prefilled cache per session."""

    m: object
    b: object  # graft_core.batch.Batcher
    caches: list
    steps: int
    repeats: int


def _rig(lm, steps: int, repeats: int) -> tuple[_Rig, float]:
    """The batcher (and its build time) and the sessions' caches, prefilled with seeded random tokens."""
    import torch

    from graft_core import batch
    from graft_core.forward import forward_chunk, new_cache

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
    return _Rig(m, b, caches, steps, repeats), build_s


def _alone(rig: _Rig, k: int):
    """`steps` greedy decode steps of k sessions, each session's step its own forward."""
    import torch

    from graft_core.forward import forward_chunk

    cs = [copy.deepcopy(c) for c in rig.caches[:k]]
    toks, pos, rows = [7 + i for i in range(k)], list(LENGTHS[:k]), [[] for _ in range(k)]
    t = time.perf_counter()
    for _ in range(rig.steps):
        for i in range(k):
            r = forward_chunk(rig.m, cs[i], [toks[i]], pos[i])[-1]
            rows[i].append(r)
            toks[i], pos[i] = int(torch.argmax(r)), pos[i] + 1
    return time.perf_counter() - t, [_digest(rows[i], cs[i]) for i in range(k)]


def _together(rig: _Rig, k: int):
    """The same steps, all k sessions' in one `Batcher.step` pass each."""
    import torch

    from graft_core import batch

    cs = [copy.deepcopy(c) for c in rig.caches[:k]]
    toks, pos, rows = [7 + i for i in range(k)], list(LENGTHS[:k]), [[] for _ in range(k)]
    t = time.perf_counter()
    for _ in range(rig.steps):
        out = rig.b.step([batch.Session(cs[i], toks[i], pos[i]) for i in range(k)])
        for i, r in enumerate(out):
            rows[i].append(r)
            toks[i], pos[i] = int(torch.argmax(r)), pos[i] + 1
    return time.perf_counter() - t, [_digest(rows[i], cs[i]) for i in range(k)]


def _prompt_ids(m, n: int) -> list[int]:
    import torch

    return torch.randint(3, m.config.vocab_size, (n,), generator=torch.Generator().manual_seed(n)).tolist()


def _prompts(rig: _Rig, k: int, stacked: bool):
    """k sessions' prompts forwarded one by one, or stacked in `Batcher.prefill` passes."""
    from graft_core.forward import forward_chunk

    cs = [copy.deepcopy(c) for c in rig.caches[:k]]
    ids = [_prompt_ids(rig.m, n) for n in PROMPTS[:k]]
    t = time.perf_counter()
    if stacked:
        rows = rig.b.prefill([(cs[i], ids[i], LENGTHS[i]) for i in range(k)])
    else:
        rows = [forward_chunk(rig.m, cs[i], ids[i], LENGTHS[i])[-1] for i in range(k)]
    return time.perf_counter() - t, [_digest([rows[i]], cs[i]) for i in range(k)]


def _arriving(rig: _Rig, k: int, one_pass: bool):
    """Sessions 0..k-2 take a decode step while session k-1's prompt arrives."""
    from graft_core import batch

    cs = [copy.deepcopy(c) for c in rig.caches[:k]]
    ids = _prompt_ids(rig.m, PROMPTS[k - 1])
    prompt, steps = [(cs[k - 1], ids, LENGTHS[k - 1])], [batch.Session(cs[i], 7 + i, LENGTHS[i]) for i in range(k - 1)]
    t = time.perf_counter()
    if one_pass:
        prompt_rows, step_rows = rig.b.run(prompt, steps)
    else:
        prompt_rows, step_rows = rig.b.prefill(prompt), rig.b.step(steps)
    rows = step_rows + prompt_rows
    return time.perf_counter() - t, [_digest([rows[i]], cs[i]) for i in range(k)]


def _alternating(one_way, other_way, repeats: int) -> tuple[list[float], list[float], bool]:
    """Both ways in turn `repeats` times (the machine drifts): their times, and whether every digest matched."""
    times_one, times_other, same = [], [], True
    for _ in range(repeats):
        s1, d1 = one_way()
        s2, d2 = other_way()
        times_one.append(s1)
        times_other.append(s2)
        same &= d1 == d2
    return times_one, times_other, same


def _level(rig: _Rig, k: int) -> dict:
    """k sessions: decode steps alone vs together, prompts alone vs stacked, a prompt arriving mid-decode."""
    med = statistics.median
    ta, tt, same = _alternating(lambda: _alone(rig, k), lambda: _together(rig, k), rig.repeats)
    pa, pt, psame = _alternating(lambda: _prompts(rig, k, False), lambda: _prompts(rig, k, True), rig.repeats)
    ma, mt, msame = _alternating(lambda: _arriving(rig, k, False), lambda: _arriving(rig, k, True), rig.repeats if k > 1 else 0)
    tokens = k * rig.steps
    level = {
        "sessions": k,
        "decode_tokens": tokens,
        "alone_s": med(ta),
        "together_s": med(tt),
        "alone_tokens_per_s": tokens / med(ta),
        "together_tokens_per_s": tokens / med(tt),
        "ratio": med(ta) / med(tt),
        "rows_and_caches_byte_equal": same,
        "prompt_tokens": sum(PROMPTS[:k]),
        "prompts_alone_s": med(pa),
        "prompts_stacked_s": med(pt),
        "prompts_ratio": med(pa) / med(pt),
        "prompt_rows_and_caches_byte_equal": psame,
    }
    if ma:
        level |= {
            "arriving_two_passes_s": med(ma),
            "arriving_one_pass_s": med(mt),
            "arriving_ratio": med(ma) / med(mt),
            "arriving_rows_and_caches_byte_equal": msame,
        }
    return level


def _step_pass(rig: _Rig, k: int) -> float:
    """Seconds of one `Batcher.step` pass of k sessions."""
    from graft_core import batch

    cs = [copy.deepcopy(c) for c in rig.caches[:k]]
    sessions = [batch.Session(cs[i], 7 + i, LENGTHS[i]) for i in range(k)]
    t = time.perf_counter()
    rig.b.step(sessions)
    return time.perf_counter() - t


def _step_pass_in_parts(rig: _Rig, k: int) -> tuple[float, dict[str, float]]:
    """One more k-session step pass with its products, attention calls and cache updates timed inside it
    (the functions wrapped for the pass, then put back): the pass's seconds and each part's."""
    from collections import defaultdict

    from transformers.models.gemma3 import modeling_gemma3 as g3

    from graft_core import batch
    from kernels import fma16

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

    vocab = tuple(rig.m.lm_head.weight.shape)
    timing(batch, "column_product", lambda a: "vocabulary" if tuple(a[0].shape) == vocab else "layer_products")
    timing(fma16, "linear", lambda a: "vocabulary" if a[3] == vocab[0] else "layer_products")  # (x, w, fmt, n)
    for cls in {type(layer) for c in rig.caches[:k] for layer in c.layers}:
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
        timed_whole = _step_pass(rig, k)
    finally:
        for obj, name, orig, own in reversed(undo):
            if own:
                setattr(obj, name, orig)
            else:
                delattr(obj, name)
    return timed_whole, parts


def _vocabulary_columns_ms(rig: _Rig) -> dict[str, float]:
    """MKL's padded column product of the vocabulary alone at each batcher width (median ms)."""
    import torch

    from bench.kernels import timed
    from graft_core import batch

    m, b = rig.m, rig.b
    x = torch.randn(max(b.widths), m.config.hidden_size, generator=torch.Generator().manual_seed(9))
    return {
        str(w): round(
            1000 * statistics.median(timed(lambda w=w: batch.column_product(m.lm_head.weight, x[:w], w), max(3, rig.repeats))),
            1,
        )
        for w in b.widths
    }


def _pass_parts(rig: _Rig, k: int) -> dict:
    """One k-session step pass timed whole (median of repeats), then once more with its parts timed."""
    whole = statistics.median([_step_pass(rig, k) for _ in range(rig.repeats)])
    timed_whole, parts = _step_pass_in_parts(rig, k)
    out = {k_: round(1000 * v, 1) for k_, v in parts.items()}
    out["rest"] = round(1000 * timed_whole - sum(out.values()), 1)
    return {
        "sessions": k,
        "pass_ms": round(1000 * whole, 1),
        "timed_pass_ms": round(1000 * timed_whole, 1),
        "parts_ms": out,
        "vocabulary_columns_ms": _vocabulary_columns_ms(rig),
    }


def _print_table(levels: list[dict], parts: dict | None) -> None:
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sessions", default="1,2,4,8")
    ap.add_argument("--out", default=str(ROOT / "docs" / "bench" / "batch.json"))
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from graft_core.model import load

    lm = load()
    rig, build_s = _rig(lm, args.steps, args.repeats)
    levels = []
    for k in [int(x) for x in args.sessions.split(",")]:
        if k > len(LENGTHS):
            raise SystemExit(f"at most {len(LENGTHS)} sessions")
        levels.append(_level(rig, k))
        print(json.dumps(levels[-1]), flush=True)
    parts = _pass_parts(rig, max(int(x) for x in args.sessions.split(","))) if rig.b.widths else None
    print(json.dumps({"pass_parts": parts}), flush=True)
    doc = {
        "benchmark": "batch",
        "command": f".venv/bin/python -m bench.batch --steps {args.steps} --repeats {args.repeats} --sessions {args.sessions}",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_avg_after": os.getloadavg()},
        "model_fingerprint": lm.fingerprint,
        "products": lm.products,
        "widths": list(rig.b.widths),
        "stacked_sizes": len(rig.b.stack_sizes),
        "prompt_tokens": list(PROMPTS),
        "batcher_build_s": build_s,
        "prefix_tokens": list(LENGTHS),
        "levels": levels,
        "pass_parts": parts,
    }
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    _print_table(levels, parts)


if __name__ == "__main__":
    main()
