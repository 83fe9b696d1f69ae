"""Where the grafted path's time to first token goes, and what other CPU kernels would do about it.

The profile behind the llama.cpp comparison (bench/peer.py). One run, real model,
the peer bench's prefix texts and question, 2 threads, medians:

1. **stages**: an answer's grafted TTFT taken apart on the real path, each stage timed on its own:
   blob read with the store's integrity check, decode, restore, the per-answer state proof (BLAKE3,
   after this process proved the artifact once), the question's forward through the 18 layers, the
   vocabulary projection, argmax. The staged logits row must be byte-equal to the one the engine's
   own forward serves (`staged_row_byte_equal`), so the stages are that computation, not a look-alike.
2. **ops**: the torch profiler over the 18-layer forward: matrix products, attention, everything else.
3. **kernels**: every matrix product of one forward (7 per layer x 18 layers with the real weights,
   and the 1-row vocabulary projection) at 1, 8 and 16 rows, through torch/MKL (the kernels in use),
   numpy/OpenBLAS and torch bfloat16, against the time to stream the same bytes once (`torch.sum`).
   Bits: whether MKL's rows depend on the row count, on the other rows, on their order, and whether
   OpenBLAS computes MKL's bits; and whether a 1-row product depends on where the weight sits in
   memory (the same values copied to 17 addresses; graft_core.determinism.place_weights pins it).
   MKL on 2 MB pages (same kernel, same placement, so the bits must stay equal) for the vocabulary
   matrix where transparent huge pages can be asked for.
4. **forward variants**: the whole question forward and projection with every `nn.Linear` through
   numpy's OpenBLAS instead of MKL, in fresh processes (the thread pools' settings only take effect
   at start): OpenBLAS default, torch's OpenMP set passive, one OpenBLAS thread; MKL beside them.
5. **the same MKL, called faster** (graft_core.products, on in the served path and so in the stages
   above): the 1-row vocabulary product split into row blocks on the pinned threads, and the layer
   products taken as (W @ x^T)^T, timed beside the plain calls in `kernels`, with the row counts at
   which each computes the plain call's bytes in `bits`. `--plain-products` (KVGRAFT_PRODUCTS=plain)
   measures the stages without them: the before side of that A/B.

Everything other than MKL (items 3 and 4) computes other bits (other kernels), so adopting it means a new
kernel fingerprint and a rebuilt store; this bench says what each would buy.

    .venv/bin/python -m bench.kernels [--repeats 7] [--prefixes 2048,4096] [--no-variants] [--plain-products]

Writes docs/bench/kernels.json and prints the tables.
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import mmap
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import settings
from bench.peer import QUESTION, wait_until_settled
from services import AnswerOptions

ROOT = Path(__file__).resolve().parents[1]
PEER = ROOT / "bench" / "llamacpp"
ROWS = (1, 8, 16)
VARIANTS = {  # name -> environment of the fresh process
    "fma16": {},
    "mkl": {"KVGRAFT_LINEAR": "torch"},
    "openblas": {"KVGRAFT_LINEAR": "torch", "KVGRAFT_BENCH_LINEAR": "openblas"},
    "openblas_omp_passive": {"KVGRAFT_BENCH_LINEAR": "openblas", "OMP_WAIT_POLICY": "PASSIVE"},
    "openblas_1_thread": {"KVGRAFT_BENCH_LINEAR": "openblas", "OPENBLAS_NUM_THREADS": "1"},
}


def ms(xs: list[float]) -> float:
    return round(statistics.median(xs) * 1e3, 4)


def timed(fn, repeats: int) -> list[float]:
    fn()  # one untimed call: first-touch and kernel selection
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def question(lm, chain) -> tuple:
    import torch

    from graft_core import generate

    q = generate.encode_prompt(lm, QUESTION, grafted=True)
    start = chain[-1].end
    return torch.tensor([q]), torch.arange(start, start + len(q)).unsqueeze(0)


def head(model, hidden):
    """The causal-LM head as Gemma3ForCausalLM applies it to the last position (softcap when configured)."""
    logits = model.lm_head(hidden[:, -1:, :])
    cap = getattr(model.config, "final_logit_softcapping", None)
    if cap is not None:
        logits = (logits / cap).tanh() * cap
    return logits[0].float()


def stages(lib, text: str, repeats: int) -> dict:
    """The grafted TTFT of one deposited prefix, stage by stage (see the module doc)."""
    import torch

    from graft_core import codec
    from graft_core.forward import forward_chunk
    from graft_core.graft import restore
    from graft_core.proof import check_probe, prove

    lm, m = lib.lm, lib.lm.model
    d = lib.deposit_text(text, title=f"kernels prefix {len(text)} chars")
    wait_until_settled(lib, d.content_sha256)
    chain, _ = lib.load_chain(d.id)
    why, known = check_probe(lm, chain, None)  # what an answer's first use does once per process
    if why:
        raise RuntimeError(f"the deposited prefix fails its own probe: {why}")
    ids, pos = question(lm, chain)
    t: dict[str, list[float]] = {k: [] for k in ("read_check", "decode", "restore", "state_proof", "layers", "vocab", "argmax")}
    rows = []
    for i in range(repeats + 1):
        c0 = time.perf_counter()
        blob = lib.read_blob(d.content_sha256)
        c1 = time.perf_counter()
        art = codec.loads(blob)
        c2 = time.perf_counter()
        cache = restore(lm, [art])
        c3 = time.perf_counter()
        proof = prove(lm, [art], cache, known)
        c4 = time.perf_counter()
        with torch.inference_mode():
            hidden = m.model(input_ids=ids, position_ids=pos, cache=cache, use_cache=True).last_hidden_state
            c5 = time.perf_counter()
            logits = head(m, hidden)
            c6 = time.perf_counter()
            int(torch.argmax(logits[-1]))
            c7 = time.perf_counter()
        if not (proof.passed and proof.kind == "state"):
            raise RuntimeError(f"the state proof did not pass: {proof.note}")
        rows.append(logits)
        if i == 0:
            continue  # first round warms the path
        for k, a, b in zip(t, (c0, c1, c2, c3, c4, c5, c6), (c1, c2, c3, c4, c5, c6, c7), strict=True):
            t[k].append(b - a)
    served = forward_chunk(m, restore(lm, chain), ids[0].tolist(), int(pos[0, 0]))
    answered = [lib.answer(QUESTION, AnswerOptions(artifact=d.id, max_new_tokens=1, record=False)).ttft_s for _ in range(repeats)]
    out = {k: ms(v) for k, v in t.items()}
    return {
        "prefix_tokens": chain[-1].end,
        "question_tokens": int(ids.shape[1]),
        "state_bytes": lib.blob_file(d.content_sha256).stat().st_size,
        "stages_ms": out,
        "staged_sum_ms": round(sum(out.values()), 2),
        "answer_ttft_ms": ms(answered),
        "staged_row_byte_equal": all(r.numpy().tobytes() == served.numpy().tobytes() for r in rows),
        "artifact_id": d.id,
    }


def ops(lib, artifact_id: str, repeats: int) -> dict:
    """The torch profiler's self CPU time over the question's forward through the 18 layers, grouped
    into matrix products, attention and the rest; medians of `repeats` profiled forwards."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from graft_core.graft import restore

    lm = lib.lm
    chain, _ = lib.load_chain(artifact_id)
    ids, pos = question(lm, chain)
    groups: dict[str, list[float]] = {"self_cpu_total_ms": [], "matrix_products_ms": [], "attention_ms": [], "rest_ms": []}
    calls = 0
    for _ in range(repeats):
        cache = restore(lm, chain)
        with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as p:
            lm.model.model(input_ids=ids, position_ids=pos, cache=cache, use_cache=True)
        events = p.key_averages()
        total = sum(e.self_cpu_time_total for e in events) / 1e6
        mm = sum(e.self_cpu_time_total for e in events if e.key in PRODUCT_OPS) / 1e6
        attn = sum(e.self_cpu_time_total for e in events if "attention" in e.key) / 1e6
        calls = sum(e.count for e in events if e.key in PRODUCT_OPS)
        for k, v in zip(groups, (total, mm, attn, total - mm - attn), strict=True):
            groups[k].append(v)
    return {k: ms(v) for k, v in groups.items()} | {"matrix_product_calls": calls}


PRODUCT_OPS = ("aten::mm", "aten::addmm", "fma16::linear")  # torch's products, and fma16's (a record_function)


def huge_page_copy(t, at: int):
    """`t` copied to an address = `at` (mod 64) in anonymous memory advised for transparent huge pages.
    Returns (copy, region to keep alive), or (None, None) where this Python cannot ask for them."""
    import torch

    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return None, None
    nbytes, align = t.numel() * t.element_size(), 2 << 20
    region = mmap.mmap(-1, nbytes + align + 64, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    region.madvise(mmap.MADV_HUGEPAGE)
    raw = torch.frombuffer(region, dtype=torch.uint8)
    off = (-raw.data_ptr()) % align + at
    out = raw[off : off + nbytes].view(t.dtype).view(t.shape)
    out.copy_(t)
    return out, region


@dataclass(frozen=True)
class _Products:
    """The matrices of one forward as the model holds them, and the products under test."""

    layers: list  # per layer, its nn.Linear weights
    vocab: object  # the vocabulary projection's weight
    shapes: list  # the distinct layer shapes, sorted, then the vocabulary's
    fma_flat: list  # fma16's product per layer weight ([] where fma16 did not take them all over)
    fma_vocab: object  # fma16's vocabulary product, or None
    split: object  # graft_core.products.SplitRows over the real vocabulary matrix

    @property
    def flat(self) -> list:
        return [w for layer in self.layers for w in layer]


def _products(model) -> _Products:
    import torch

    from graft_core import products
    from kernels import fma16

    layers = [
        [mod.weight.detach() for mod in layer.modules() if isinstance(mod, torch.nn.Linear)] for layer in model.model.layers
    ]
    vocab = model.lm_head.weight.detach()
    # fma16's products as the model holds them (over GGUF blocks where checked equal), where it took them over
    fma_flat = [
        fma16.product_of(mod) for layer in model.model.layers for mod in layer.modules() if isinstance(mod, torch.nn.Linear)
    ]
    fma_vocab = fma16.product_of(model.lm_head)
    if not all(fma_flat) or fma_vocab is None:
        fma_flat, fma_vocab = [], None
    split = products.SplitRows(
        torch.nn.Linear(vocab.shape[1], vocab.shape[0], bias=False, device="meta"), torch.get_num_threads()
    )
    split.linear.weight = torch.nn.Parameter(vocab, requires_grad=False)  # the real matrix, no copy
    shapes = sorted({tuple(w.shape) for w in layers[0]}) + [tuple(vocab.shape)]
    return _Products(layers, vocab, shapes, fma_flat, fma_vocab, split)


def _product_times(p: _Products, gen, repeats: int) -> dict:
    """Median ms of every product of a forward per kernel at each of ROWS rows, and of streaming the bytes."""
    import torch
    import torch.nn.functional as F

    from graft_core import products

    flat, vocab, fma_flat, fma_vocab = p.flat, p.vocab, p.fma_flat, p.fma_vocab

    def through(weights, x, fn):
        for w in weights:
            fn(x[w.shape[1]], w)

    bf_flat, bf_vocab = [w.to(torch.bfloat16) for w in flat], vocab.to(torch.bfloat16)  # 0.5 GB, freed on return
    np_flat, np_vocab = [w.numpy().T for w in flat], vocab.numpy().T
    rows = {}
    for m_rows in ROWS:
        x = {k: torch.randn(m_rows, k, generator=gen) for k in {s[1] for s in p.shapes}}
        xb = {k: v.to(torch.bfloat16) for k, v in x.items()}
        xn = {k: v.numpy() for k, v in x.items()}
        rows[str(m_rows)] = {
            "layers_mkl_ms": ms(timed(lambda x=x: through(flat, x, F.linear), repeats)),
            "layers_openblas_ms": ms(timed(lambda xn=xn: [xn[w.shape[0]] @ w for w in np_flat], repeats)),
            "layers_bf16_ms": ms(timed(lambda xb=xb: through(bf_flat, xb, F.linear), repeats)),
            "vocab_mkl_ms": ms(timed(lambda x=x: F.linear(x[vocab.shape[1]], vocab), repeats)),
            "vocab_openblas_ms": ms(timed(lambda xn=xn: xn[vocab.shape[1]] @ np_vocab, repeats)),
            "vocab_bf16_ms": ms(timed(lambda xb=xb: F.linear(xb[vocab.shape[1]], bf_vocab), repeats)),
            "layers_mkl_transposed_ms": ms(
                timed(lambda x=x: through(flat, x, lambda x, w: products.transposed_product(w, x)), repeats)
            ),
        }
        if fma_vocab is not None:
            rows[str(m_rows)] |= {
                "layers_fma16_ms": ms(timed(lambda x=x: [op.product(x[op.k]) for op in fma_flat], repeats)),
                "vocab_fma16_ms": ms(timed(lambda x=x: fma_vocab.product(x[vocab.shape[1]]), repeats)),
            }
        if m_rows == 1:
            rows["1"]["vocab_mkl_split_ms"] = ms(timed(lambda x=x: p.split.split(x[vocab.shape[1]]), repeats))
    stream_once = {
        "layers": ms(timed(lambda: [w.sum() for w in flat], repeats)),
        "vocab": ms(timed(lambda: vocab.sum(), repeats)),
        "layers_bytes": sum(w.numel() * 4 for w in flat),
        "vocab_bytes": vocab.numel() * 4,
    }
    return {"rows": rows, "stream_once_ms": stream_once}


def _row_bits(p: _Products, gen) -> dict:
    """Per shape: whether a product's rows depend on the row count, the other rows or their order, and
    which kernels compute the same bytes."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    from graft_core import products

    vocab, bits = p.vocab, {}
    for w in [next(w for w in p.layers[0] if tuple(w.shape) == s) for s in p.shapes[:-1]] + [vocab]:
        x8 = torch.randn(8, w.shape[1], generator=gen)
        full = F.linear(x8, w)
        perm = torch.randperm(8, generator=gen)
        other = x8.clone()
        other[1:] = torch.randn(7, w.shape[1], generator=gen)
        one = F.linear(x8[:1], w)
        bits["x".join(map(str, w.shape))] = {
            "mkl_row_of_8_equals_1_row": all(torch.equal(full[i : i + 1], F.linear(x8[i : i + 1], w)) for i in range(8)),
            "mkl_8_rows_order_invariant": bool(torch.equal(F.linear(x8[perm], w), full[perm])),
            "mkl_8_rows_independent_of_other_rows": bool(torch.equal(F.linear(other, w)[0], full[0])),
            "openblas_equals_mkl_1_row": bool(np.array_equal(x8[:1].numpy() @ w.numpy().T, one.numpy())),
        }
        op = next((o for o in [*p.fma_flat, p.fma_vocab] if o is not None and o.module.weight.data_ptr() == w.data_ptr()), None)
        if op is not None:
            f8 = op.product(x8)
            bits["x".join(map(str, w.shape))] |= {
                "fma16_row_of_8_equals_1_row": all(torch.equal(f8[i], op.product(x8[i : i + 1])[0]) for i in range(8)),
                "fma16_8_rows_independent_of_other_rows": bool(torch.equal(op.product(other)[0], f8[0])),
                "fma16_equals_mkl_1_row": bool(torch.equal(op.product(x8[:1]), one)),
            }
        if w is not vocab:
            equal = sorted(products.transposed_rows(w, range(1, 65)))
            bits["x".join(map(str, w.shape))]["mkl_transposed_equal_at_rows"] = spans(equal)
    v1 = torch.randn(1, vocab.shape[1], generator=gen)
    bits["x".join(map(str, vocab.shape))]["mkl_1_row_split_in_blocks_equal"] = bool(
        torch.equal(p.split.split(v1), F.linear(v1, vocab))
    )
    bits["x".join(map(str, vocab.shape))]["split_blocks"] = len(p.split.bounds)
    return bits


def _address_bits(p: _Products, gen) -> dict:
    """Per matrix (the vocabulary and a down projection): how many results a 1-row product gives for the
    same values at other addresses."""
    import torch
    import torch.nn.functional as F

    from graft_core.determinism import copy_at

    bits = {}
    for w in (p.vocab, p.layers[0][-1]):
        x1 = torch.randn(1, w.shape[1], generator=gen)
        by_address = {}
        for at in range(0, 68, 4):  # 17 addresses mod 128: the 16 four-byte steps of 64 bytes, and 64 itself
            by_address[at] = F.linear(x1, copy_at(w, at, 128)).numpy().tobytes()
        bits["x".join(map(str, w.shape))] = {
            "mkl_1_row_distinct_results_over_16_addresses_mod_64": len({by_address[a] for a in range(0, 64, 4)}),
            "mkl_1_row_distinct_results_over_4_addresses_mod_16": len({by_address[a] for a in range(0, 16, 4)}),
            "mkl_1_row_same_64_bytes_apart": by_address[0] == by_address[64],
            "mkl_1_row_same_16_bytes_apart": by_address[0] == by_address[16],
            "loaded_weight_address_mod_64": w.data_ptr() % 64,
        }
    return bits


def _huge_pages(vocab, gen, repeats: int) -> dict:
    """The 1-row vocabulary product on a copy in 2 MB pages beside the loaded matrix, where they can be asked for."""
    import torch
    import torch.nn.functional as F

    from graft_core.determinism import WEIGHT_PLACEMENT

    huge, region = huge_page_copy(vocab, WEIGHT_PLACEMENT[1])
    if huge is None:
        return {"skipped": "this Python's mmap cannot advise MADV_HUGEPAGE"}
    v1 = torch.randn(1, vocab.shape[1], generator=gen)
    plain, paged = [], []
    for _ in range(3):  # interleaved, the machine drifts
        plain += timed(lambda: F.linear(v1, vocab), repeats)
        paged += timed(lambda huge=huge: F.linear(v1, huge), repeats)
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    out = {
        "thp_mode": thp.read_text().strip() if thp.exists() else "unknown",
        "plain_ms": ms(plain),
        "huge_pages_ms": ms(paged),
        # over several rows: a kernel chosen by placement changes every row's bits, not one row's
        "same_bits": all(
            bool(torch.equal(F.linear(v, vocab), F.linear(v, huge)))
            for v in (v1, *torch.randn(3, 1, vocab.shape[1], generator=gen))
        ),
    }
    del huge
    region.close()
    return out


def kernels(model, repeats: int) -> dict:
    """Every matrix product of one forward, per kernel and row count (see the module doc)."""
    import torch

    gen = torch.Generator().manual_seed(0)  # one stream, drawn in this order: the same inputs on every run
    p = _products(model)
    out: dict = {
        "products_per_forward": len(p.flat),
        "per_layer_shapes": [tuple(w.shape) for w in p.layers[0]],
        "vocab_shape": list(p.vocab.shape),
    }
    out |= _product_times(p, gen, repeats)
    bits = _row_bits(p, gen)
    for shape, b in _address_bits(p, gen).items():
        bits[shape] |= b
    out["bits"] = bits
    out["vocab_mkl_huge_pages"] = _huge_pages(p.vocab, gen, repeats)
    return out


def spans(ns: list[int]) -> str:
    """[1, 12, 13, 14] -> "1,12-14" ("" for none)."""
    out, i = [], 0
    while i < len(ns):
        j = i
        while j + 1 < len(ns) and ns[j + 1] == ns[j] + 1:
            j += 1
        out.append(str(ns[i]) if i == j else f"{ns[i]}-{ns[j]}")
        i = j + 1
    return ",".join(out)


def variant_main(prefix_tokens: int, repeats: int) -> None:
    """In a fresh process: prefill the peer prefix, then time the question's layers and projection (JSON line)."""
    import torch

    if settings.get("KVGRAFT_BENCH_LINEAR") == "openblas":
        import numpy as np  # noqa: F401 - OpenBLAS's pool starts with numpy

    from graft_core import generate
    from graft_core.forward import forward_chunk, new_cache
    from graft_core.model import load

    lm = load()
    m = lm.model
    prefix = lm.tokenizer(PEER.joinpath(f"prefix_{prefix_tokens}.txt").read_text(encoding="utf-8"))["input_ids"]
    cache0 = new_cache(m)
    forward_chunk(m, cache0, prefix, 0)
    if settings.get("KVGRAFT_BENCH_LINEAR") == "openblas":
        from graft_core import products
        from kernels import fma16

        products.undo(m)  # per-module fast paths would shadow the class's forward
        fma16.undo(m)
        torch.nn.Linear.forward = _openblas_linear
    q = generate.encode_prompt(lm, QUESTION, grafted=True)
    ids, pos = torch.tensor([q]), torch.arange(len(prefix), len(prefix) + len(q)).unsqueeze(0)
    layers_t, vocab_t = [], []
    for i in range(repeats + 1):
        cache = copy.deepcopy(cache0)
        with torch.inference_mode():
            t = time.perf_counter()
            hidden = m.model(input_ids=ids, position_ids=pos, cache=cache, use_cache=True).last_hidden_state
            t1 = time.perf_counter()
            head(m, hidden)
            t2 = time.perf_counter()
        if i:
            layers_t.append(t1 - t)
            vocab_t.append(t2 - t1)
    print(json.dumps({"layers_ms": ms(layers_t), "vocab_ms": ms(vocab_t), "prefix_tokens": len(prefix)}))


def _openblas_linear(self, x):
    import torch

    shape = x.shape
    y = torch.from_numpy(x.reshape(-1, shape[-1]).contiguous().numpy() @ self.weight.detach().numpy().T)
    if self.bias is not None:
        y = y + self.bias
    return y.reshape(*shape[:-1], self.weight.shape[0])


def variants(prefix_tokens: int, repeats: int) -> dict:
    out = {}
    for name, env in VARIANTS.items():
        cmd = [sys.executable, "-m", "bench.kernels", "--variant", str(prefix_tokens), "--repeats", str(repeats)]
        r = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"variant {name} failed ({r.returncode}): {r.stderr.strip()[-400:]}")
        out[name] = {"env": env, **json.loads(r.stdout.strip().splitlines()[-1])}
        print("variant", name, json.dumps(out[name]), flush=True)
    return out


def tables(doc: dict) -> str:
    lines = ["| prefix tokens | " + " | ".join(doc["stage_names"]) + " | sum | answer TTFT | ops: products / attention / rest |"]
    lines.append("|---:|" + "---:|" * (len(doc["stage_names"]) + 3))
    for r in doc["prefixes"]:
        s, o = r["stages_ms"], r["ops"]
        lines.append(
            f"| {r['prefix_tokens']:,} | "
            + " | ".join(f"{s[k]:.1f}" for k in doc["stage_names"])
            + f" | {r['staged_sum_ms']:.1f} | {r['answer_ttft_ms']:.1f} | "
            f"{o['matrix_products_ms']:.1f} / {o['attention_ms']:.1f} / {o['rest_ms']:.1f} |"
        )
    k = doc["kernels"]
    lines += [
        "",
        "| rows | layers fma16 (ms) | layers MKL / MKL transposed / OpenBLAS / bf16 (ms) | vocab fma16 (ms) | vocab MKL / MKL split / OpenBLAS / bf16 (ms) |",
        "|---:|---:|---|---:|---|",
    ]
    for m_rows, r in k["rows"].items():
        split = f"{r['vocab_mkl_split_ms']:.1f}" if "vocab_mkl_split_ms" in r else "-"
        fl, fv = (f"{r[k]:.1f}" if k in r else "-" for k in ("layers_fma16_ms", "vocab_fma16_ms"))
        lines.append(
            f"| {m_rows} | {fl} | {r['layers_mkl_ms']:.1f} / {r['layers_mkl_transposed_ms']:.1f} / {r['layers_openblas_ms']:.1f} / "
            f"{r['layers_bf16_ms']:.1f} | {fv} | {r['vocab_mkl_ms']:.1f} / {split} / {r['vocab_openblas_ms']:.1f} / {r['vocab_bf16_ms']:.1f} |"
        )
    f = k["stream_once_ms"]
    lines.append(
        f"\nstreaming the bytes once: layers {f['layers']:.1f} ms ({f['layers_bytes'] / 1e6:.0f} MB), vocab {f['vocab']:.1f} ms ({f['vocab_bytes'] / 1e6:.0f} MB)"
    )
    if doc.get("variants"):
        lines += ["", "| whole forward | layers (ms) | vocab (ms) |", "|---|---:|---:|"]
        lines += [f"| {n} | {v['layers_ms']:.1f} | {v['vocab_ms']:.1f} |" for n, v in doc["variants"].items()]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--prefixes", default="2048,4096")
    ap.add_argument("--no-variants", action="store_true", help="skip the OpenBLAS whole-forward processes")
    ap.add_argument(
        "--no-large-buffers",
        action="store_true",
        help="leave glibc's allocation thresholds as they are (graft_core.model.keep_large_buffers off): the 'before' side of its A/B",
    )
    ap.add_argument(
        "--plain-products",
        action="store_true",
        help="KVGRAFT_PRODUCTS=plain: every product through the plain nn.Linear (graft_core.products off), the before side",
    )
    ap.add_argument(
        "--torch-products",
        action="store_true",
        help="KVGRAFT_LINEAR=torch: MKL's products (with graft_core.products) instead of fma16, the before side of fma16",
    )
    ap.add_argument("--variant", type=int, help=argparse.SUPPRESS)  # internal: one forward-variant process
    ap.add_argument("--out", default=str(ROOT / "docs" / "bench" / "kernels.json"))
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.variant:
        variant_main(args.variant, args.repeats)
        return
    if args.plain_products or args.torch_products:
        os.environ["KVGRAFT_LINEAR"] = "torch"  # read when the model loads, here and in the variant processes
    if args.plain_products:
        os.environ["KVGRAFT_PRODUCTS"] = "plain"
    if args.no_large_buffers:
        from graft_core import model as model_mod

        model_mod.keep_large_buffers = lambda: False  # load() calls it through the module
    import services
    from retrieval.embedder import HashEmbedder

    load = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory(prefix="kvgraft-kernels-") as tmp:
        lib = services.Library(home=Path(tmp), embedder=HashEmbedder())
        for n in [int(x) for x in args.prefixes.split(",")]:
            r = stages(lib, PEER.joinpath(f"prefix_{n}.txt").read_text(encoding="utf-8"), args.repeats)
            r["ops"] = ops(lib, r["artifact_id"], args.repeats)
            print("stages", json.dumps(r), flush=True)
            rows.append(r)
        kern = kernels(lib.lm.model, args.repeats)
        print("kernels", json.dumps(kern), flush=True)
        fingerprint, products_line = lib.lm.fingerprint, lib.lm.products
    first = int(args.prefixes.split(",")[0])
    doc = {
        "benchmark": "kernels",
        "command": f".venv/bin/python -m bench.kernels --repeats {args.repeats} --prefixes {args.prefixes}"
        + (" --no-variants" if args.no_variants else "")
        + (" --no-large-buffers" if args.no_large_buffers else "")
        + (" --plain-products" if args.plain_products else "")
        + (" --torch-products" if args.torch_products else ""),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_avg_before": load},
        "model_fingerprint": fingerprint,
        "products": products_line,
        "stage_names": list(rows[0]["stages_ms"]),
        "prefixes": rows,
        "kernels": kern,
        "variants": None if args.no_variants else variants(first, args.repeats),
    }
    doc["machine"]["load_avg_after"] = os.getloadavg()
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print("\n" + tables(doc))


if __name__ == "__main__":
    main()
