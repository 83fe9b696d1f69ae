"""Scale benchmark: a store far larger than the model's 32,768-token window, with flat memory.

Fills a temporary store in three stages of one run: real deposits (text prefilled by the real
model, up to a token target or a time budget) and then SYNTHETIC artifacts (random float32
payloads in the model's exact per-layer shapes, recorded in the catalog with random embeddings)
until the store holds the target (default 2,854,766 tokens, the published usable-context figure).
At 1%, 10% and 100% of the target, and on the empty store, a FRESH serving process opens the
store and measures its RSS and the latency of retrieve + load_artifact + restore over real
artifacts, so the writer's own buffers never count. Writes docs/bench/scale.json and prints a
table. The temporary store is deleted at the end (unless --keep).

    .venv/bin/python -m bench.scale                     # defaults below
    .venv/bin/python -m bench.scale --real-tokens 100000 --real-budget-s 900
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TARGET_TOKENS = 2_854_766
WINDOW = 32_768
CHUNK_CHARS = 6_000


# ---- real text ------------------------------------------------------------------------------


def real_texts():
    """Real text, deterministic order: the datasets' facts and worked solutions, then the Python
    standard library's source files (sorted), cut at line boundaries into ~6,000-character chunks."""
    ds = ROOT / "datasets"
    facts = [json.loads(x) for x in (ds / "knowledge.jsonl").read_text().splitlines() if x.strip()]
    probs = [json.loads(x) for x in (ds / "problems.jsonl").read_text().splitlines() if x.strip()]
    docs = [("datasets/knowledge.jsonl facts", "\n".join(f["fact"] for f in facts))]
    docs.append(("datasets/problems.jsonl solutions", "\n\n".join(p["question"] + "\n" + p["solution"] for p in probs)))
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    docs += [(f"python stdlib {p.name}", p.read_text(encoding="utf-8", errors="replace")) for p in sorted(stdlib.glob("*.py"))]
    for name, text in docs:
        buf, part = [], 0
        for line in text.splitlines(keepends=True):
            buf.append(line)
            if sum(map(len, buf)) >= CHUNK_CHARS:
                yield f"{name} #{part}", "".join(buf)
                buf, part = [], part + 1
        if "".join(buf).strip():
            yield f"{name} #{part}", "".join(buf)


# ---- synthetic artifacts ----------------------------------------------------------------------


class Synth:
    """Random KV payloads of the model's exact shapes and dtype, drawn as slices of one random pool."""

    def __init__(self, lm, seed: int = 0):
        import numpy as np

        self.lm, self.np = lm, np
        self.rng = np.random.default_rng(seed)
        self.pool = self.rng.standard_normal(48_000_000, dtype=np.float32)  # 192 MB of random floats
        self.count = 0

    def artifact(self, n: int):
        import torch

        from graft_core.artifact import KVArtifact

        info = self.lm.info
        h, d, w = info.num_kv_heads, info.head_dim, info.sliding_window
        keys, values, seen = [], [], []
        for lt in info.layer_types:
            rows = min(n, w - 1) if (lt == "sliding_attention" and w) else n
            for out in (keys, values):
                size = h * rows * d
                off = int(self.rng.integers(0, self.pool.size - size))
                out.append(torch.from_numpy(self.pool[off : off + size]).view(1, h, rows, d))
            seen.append(n)
        ids = torch.from_numpy(self.rng.integers(0, info.vocab_size, n).astype("int64"))
        self.count += 1
        return KVArtifact(
            keys=tuple(keys),
            values=tuple(values),
            token_ids=ids,
            model_fingerprint=self.lm.fingerprint,
            tokenizer_fingerprint=info.tokenizer_sha256,
            dtype="float32",
            start=0,
            layer_types=tuple(info.layer_types),
            seen=tuple(seen),
            metadata={"synthetic": "random payload, not a model computation"},
        )


def add_synthetic(lib, synth: Synth, n: int) -> int:
    import numpy as np

    from db.rows import ArtifactRow, SourceRow
    from graft_core import codec

    art = synth.artifact(n)
    data = codec.dumps(art)
    vec = synth.rng.standard_normal(lib.embedder.dim).astype("<f4")
    vec /= np.linalg.norm(vec)
    key = art.key
    row = ArtifactRow(
        id=key,
        content_sha256="",
        model_fingerprint=art.model_fingerprint,
        tokens=n,
        start=0,
        kind="text",
        title=f"SYNTHETIC #{synth.count} ({n} tokens, random payload)",
        parent_id=None,
        bytes=len(data),
    )
    text = f"SYNTHETIC artifact #{synth.count}: random float32 tensors in the model's shapes"
    src = SourceRow(artifact_id=key, text=text)
    emb = (lib.embedder.embedder_id, vec.tobytes(), int(vec.shape[0]), hashlib.sha256(text.encode()).hexdigest())
    lib.record_synthetic(row, src, emb, data)
    return len(data)


# ---- the serving probe (a fresh process per level) ---------------------------------------------


def probe(home: str, queries: list[str], threads: int) -> dict:
    """Open the store as a server would, then retrieve + load + restore for each query."""
    import psutil
    import torch

    import retrieval  # noqa: F401
    import services
    from graft_core.graft import restore

    os.environ["KVGRAFT_THREADS"] = str(threads)  # applied by the pin when the model loads
    torch.set_num_threads(threads)
    proc = psutil.Process()
    lib = services.Library(home=home)
    lm, emb = lib.lm, lib.embedder
    emb.embed("warm up")
    t0 = time.perf_counter()
    idx = lib.index()
    index_s = time.perf_counter() - t0
    gc.collect()
    rss_open = proc.memory_info().rss
    lat, ret, load, rest, real_hits, synth_top, rss_peak = [], [], [], [], 0, 0, rss_open
    for q in queries:
        t0 = time.perf_counter()
        hits = lib.retrieve(q, k=3) if len(idx) else []
        t1 = time.perf_counter()
        real = [h for h in hits if not h.title.startswith("SYNTHETIC")]
        if hits and hits[0].title.startswith("SYNTHETIC"):
            synth_top += 1
        if not real:
            continue
        chain, _ = lib.load_chain(real[0].id)
        t2 = time.perf_counter()
        cache = restore(lm, chain)
        t3 = time.perf_counter()
        del cache, chain
        real_hits += 1
        ret.append(t1 - t0)
        load.append(t2 - t1)
        rest.append(t3 - t2)
        lat.append(t3 - t0)
        rss_peak = max(rss_peak, proc.memory_info().rss)
    gc.collect()
    rss_after = proc.memory_info().rss

    def pct(v, q):
        if not v:
            return None
        s = sorted(v)
        return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]

    return {
        "artifacts": lib.count(),
        "tokens": lib.stored_tokens(),
        "index_kind": idx.kind,
        "index_build_or_load_s": index_s,
        "rss_open_bytes": rss_open,
        "rss_after_queries_bytes": rss_after,
        "rss_peak_bytes": rss_peak,
        "queries": len(queries),
        "queries_with_real_hit": real_hits,
        "queries_synthetic_top1": synth_top,
        "latency_s": {"p50": pct(lat, 0.5), "p99": pct(lat, 0.99)},
        "retrieve_s": {"p50": pct(ret, 0.5), "p99": pct(ret, 0.99)},
        "load_artifact_s": {"p50": pct(load, 0.5), "p99": pct(load, 0.99)},
        "restore_s": {"p50": pct(rest, 0.5), "p99": pct(rest, 0.99)},
    }


def run_probe(home: str, queries: list[str], threads: int) -> dict:
    qfile = Path(home) / "probe-queries.json"
    qfile.write_text(json.dumps(queries))
    out = subprocess.run(
        [sys.executable, "-m", "bench.scale", "--probe", home, "--probe-queries", str(qfile), "--threads", str(threads)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"probe failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# ---- the run ----------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target-tokens", type=int, default=TARGET_TOKENS)
    p.add_argument("--real-tokens", type=int, default=100_000, help="stop real deposits at this many tokens")
    p.add_argument("--real-budget-s", type=float, default=900.0, help="or after this many seconds, whichever first")
    p.add_argument("--synthetic-tokens", type=int, default=32_000, help="tokens per synthetic artifact")
    p.add_argument("--queries", type=int, default=60)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--home", default=None, help="parent folder for the temporary store (default: system temp)")
    p.add_argument("--keep", action="store_true")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "bench" / "scale.json")
    p.add_argument("--report", type=Path, help="only rewrite the markdown table from this scale.json")
    p.add_argument("--probe", help=argparse.SUPPRESS)
    p.add_argument("--probe-queries", help=argparse.SUPPRESS)
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.report:
        path = markdown(json.loads(args.report.read_text()), args.report.with_suffix(".md"))
        print(f"wrote {path}")
        return 0
    if args.probe:
        print(json.dumps(probe(args.probe, json.loads(Path(args.probe_queries).read_text()), args.threads)))
        return 0

    import psutil
    import torch

    import retrieval  # noqa: F401
    import services

    os.environ["KVGRAFT_THREADS"] = str(args.threads)  # applied by the pin when the model loads
    torch.set_num_threads(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="kvgraft-scale-", dir=args.home))
    home = tmp / "home"
    result: dict = {"target_tokens": args.target_tokens, "model_window": WINDOW, "levels": [], "notes": []}
    try:
        lib = services.Library(home=home)
        lm = lib.lm
        info = lm.info
        target, layout = _disk_plan(info, tmp, args, result)
        result["measured_target_tokens"] = target
        levels = [int(target * f) for f in (0.01, 0.10, 1.0)]
        queries_pool: list[str] = []
        result["levels"].append({"fraction": 0.0, **run_probe(str(home), ["warm up query"], args.threads)})
        print("empty store probed", flush=True)

        def measure(frac: float) -> None:
            qs = [queries_pool[i * len(queries_pool) // args.queries] for i in range(args.queries)] if queries_pool else []
            m = run_probe(str(home), qs, args.threads)
            m["fraction"] = frac
            m["blob_bytes"] = du(home / "blobs")
            m["bytes_per_token"] = m["blob_bytes"] / max(1, m["tokens"])
            m["real_tokens"], m["synthetic_tokens"] = real_tokens, synth_tokens
            result["levels"].append(m)
            print(f"level {frac:.0%}: {json.dumps(m)}", flush=True)

        # stage 1: real deposits
        real_tokens = synth_tokens = 0
        real_bytes = 0
        t0 = time.perf_counter()
        done = 0
        prefill = 0.0
        for title, text in real_texts():
            if real_tokens >= args.real_tokens or time.perf_counter() - t0 > args.real_budget_s:
                break
            d = lib.deposit_text(text, title=f"REAL {title}")
            real_tokens += d.tokens
            real_bytes += d.bytes
            prefill += d.prefill_s
            queries_pool.append(" ".join(text.split()[:40]))
            while done < len(levels) and real_tokens >= levels[done]:
                measure([0.01, 0.10, 1.0][done])
                done += 1
        real_s = time.perf_counter() - t0
        result["real"] = {
            "tokens": real_tokens,
            "artifacts": len(queries_pool),
            "wall_s": real_s,
            "prefill_s": prefill,
            "ms_per_token_wall": 1000 * real_s / max(1, real_tokens),
            "ms_per_token_prefill": 1000 * prefill / max(1, real_tokens),
            "bytes": real_bytes,
            "bytes_per_token": real_bytes / max(1, real_tokens),
            "source": "datasets facts and solutions, then Python standard library sources, ~6,000-character chunks",
            "reached_token_target": real_tokens >= args.real_tokens,
            "budget_s": args.real_budget_s,
        }
        print(f"real: {json.dumps(result['real'])}", flush=True)
        # stage 2: synthetic fill
        synth = Synth(lm)
        t1 = time.perf_counter()
        synth_bytes = 0
        while done < len(levels):
            need = levels[done] - (real_tokens + synth_tokens)
            if need <= 0:
                measure([0.01, 0.10, 1.0][done])
                done += 1
                continue
            n = min(args.synthetic_tokens, need)
            synth_bytes += add_synthetic(lib, synth, n)
            synth_tokens += n
            gc.collect()
        result["synthetic"] = {
            "label": "SYNTHETIC: random float32 payloads in the model's exact shapes; not model computations",
            "artifacts": synth.count,
            "tokens": synth_tokens,
            "tokens_per_artifact": args.synthetic_tokens,
            "bytes": synth_bytes,
            "bytes_per_token": synth_bytes / max(1, synth_tokens),
            "write_s": time.perf_counter() - t1,
        }
        result["writer_rss_bytes_end"] = psutil.Process().memory_info().rss
        _summarise(result, args, target, lm.fingerprint, layout)
        lib.close()
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
            result["cleaned_up"] = True
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(table(result))
    print(f"wrote {args.out} and {markdown(result, args.out.with_suffix('.md'))}")
    return 0


def _disk_plan(info, tmp: Path, args, result: dict) -> tuple[int, dict]:
    """How many tokens this disk can hold (the rest is extrapolated, labelled) and the artifact layout."""
    full = sum(1 for t in info.layer_types if t != "sliding_attention")
    sliding = info.num_layers - full
    per_tok_full = full * 2 * info.num_kv_heads * info.head_dim * 4
    per_art_sliding = sliding * 2 * info.num_kv_heads * (info.sliding_window - 1) * info.head_dim * 4
    est = args.target_tokens * (per_tok_full + 8) + (args.target_tokens // args.synthetic_tokens + 1) * per_art_sliding
    free = shutil.disk_usage(tmp).free
    result["disk"] = {"free_bytes_before": free, "estimated_store_bytes": est, "path": str(tmp)}
    target = args.target_tokens
    if est > free - 8 * 2**30:
        target = int(args.target_tokens * (free - 8 * 2**30) / est)
        result["notes"].append(
            f"disk: {free / 2**30:.1f} GiB free, the full store needs ~{est / 2**30:.1f} GiB; measured up to {target:,} tokens "
            "and extrapolated the rest (labelled)"
        )
    layout = {
        "layers": info.num_layers,
        "full_layers": full,
        "sliding_layers": sliding,
        "window": info.sliding_window,
        "kv_heads": info.num_kv_heads,
        "head_dim": info.head_dim,
        "dtype": "float32",
        "full_bytes_per_token": per_tok_full,
        "sliding_bytes_per_artifact_max": per_art_sliding,
    }
    return target, layout


def _summarise(result: dict, args, target: int, fingerprint: str, layout: dict) -> None:
    """The figures derived from the measured levels: extrapolation (labelled), RSS growth, layout."""
    if target < args.target_tokens:
        top = result["levels"][-1]
        result["extrapolated_100pct"] = {
            "label": "EXTRAPOLATED, not measured",
            "tokens": args.target_tokens,
            "blob_bytes": int(top["blob_bytes"] + (args.target_tokens - top["tokens"]) * result["synthetic"]["bytes_per_token"]),
        }
    base = result["levels"][0]["rss_open_bytes"]
    for lv in result["levels"]:
        lv["rss_growth_vs_empty"] = lv["rss_after_queries_bytes"] / base - 1
        lv["rss_open_growth_vs_empty"] = lv["rss_open_bytes"] / base - 1
    result["tokens_over_window"] = result["levels"][-1]["tokens"] / WINDOW
    result["layout"] = layout
    result["model_fingerprint"] = fingerprint
    result["threads"] = args.threads


def table(r: dict) -> str:
    """RSS of a fresh serving process: right after opening the store (index built) vs the empty store,
    and after the query workload vs the smallest store that could serve it (1%)."""
    rows = [
        "| store | tokens (real + SYNTHETIC) | x window | artifacts | RSS open (MiB) | vs empty | RSS after queries (MiB) | vs 1% | "
        "retrieve+load+restore p50 / p99 (ms) | bytes on disk / token |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    base_open = r["levels"][0]["rss_open_bytes"]
    first = next((lv for lv in r["levels"] if lv["fraction"] > 0), None)
    for lv in r["levels"]:
        lat = lv["latency_s"]
        p50 = f"{lat['p50'] * 1000:.0f}" if lat["p50"] is not None else "n/a"
        p99 = f"{lat['p99'] * 1000:.0f}" if lat["p99"] is not None else "n/a"
        bpt = f"{lv['bytes_per_token']:,.0f}" if "bytes_per_token" in lv else "n/a"
        rt, st = lv.get("real_tokens", 0), lv.get("synthetic_tokens", 0)
        after = "n/a (no query can hit)" if lv["fraction"] == 0 else f"{lv['rss_after_queries_bytes'] / 2**20:,.0f}"
        vs1 = (
            ""
            if (lv["fraction"] == 0 or first is None)
            else f"{lv['rss_after_queries_bytes'] / first['rss_after_queries_bytes'] - 1:+.1%}"
        )
        rows.append(
            f"| {lv['fraction']:.0%} | {lv['tokens']:,} ({rt:,} + {st:,}) | {lv['tokens'] / WINDOW:.1f} | {lv['artifacts']} | "
            f"{lv['rss_open_bytes'] / 2**20:,.0f} | {lv['rss_open_bytes'] / base_open - 1:+.1%} | {after} | {vs1} | {p50} / {p99} | {bpt} |"
        )
    return "\n".join(rows)


def markdown(r: dict, path: Path) -> Path:
    real, syn = r["real"], r["synthetic"]
    lines = [
        "# Scale: a store far wider than the model's window",
        "",
        "Generated by `bench/scale.py` from `scale.json`; do not edit by hand.",
        "",
        f"Target {r['target_tokens']:,} tokens (the published usable-context figure) against the model's "
        f"{r['model_window']:,}-token window; measured up to {r['levels'][-1]['tokens']:,} tokens "
        f"({r['tokens_over_window']:.0f}x the window). Each row is a FRESH serving process opened on the store "
        f"({r['threads']} torch thread): RSS after {r['levels'][-1]['queries']} queries, and the latency of "
        "retrieve (embed + FAISS) + load_artifact (read + SHA-256 check + decode) + restore, over real artifacts only.",
        "",
        table(r),
        "",
        "RSS growth against the empty store right after opening (catalog + FAISS index built) shows what the store's size costs a "
        "server; after the query workload the process also holds the allocator's high-water mark from loading and restoring "
        "artifacts, which an empty store cannot exercise, so that column is compared with the 1% store instead. "
        f"The empty store's process after opening: {r['levels'][0]['rss_open_bytes'] / 2**20:,.0f} MiB; the 1% store after queries: "
        f"{r['levels'][1]['rss_after_queries_bytes'] / 2**20:,.0f} MiB "
        f"({r['levels'][1]['rss_after_queries_bytes'] / r['levels'][0]['rss_open_bytes'] - 1:+.1%} vs the empty store).",
        "",
        f"- **Real deposits**: {real['tokens']:,} tokens in {real['artifacts']} artifacts ({real['source']}), "
        f"{real['wall_s']:.0f} s wall (budget {real['budget_s']:.0f} s): {real['ms_per_token_prefill']:.1f} ms/token prefill, "
        f"{real['ms_per_token_wall']:.1f} ms/token wall including probe, embedding, hashing, writing and the 1% measurement, "
        f"on 2 CPU cores shared with other jobs. "
        + (
            "The real-token target was reached."
            if real["reached_token_target"]
            else f"**The 100,000-token real target was NOT reached within the time budget**: at the measured rate it needs ~{100_000 * real['ms_per_token_wall'] / 60000:.0f} min here."
        ),
        f"- **SYNTHETIC artifacts**: {syn['artifacts']} artifacts, {syn['tokens']:,} tokens, {syn['tokens_per_artifact']:,} tokens each: "
        "random float32 payloads in the model's exact shapes (18 layers; sliding layers [1,1,min(n,511),256], full layers [1,1,n,256]), "
        "catalog rows and random unit embeddings. They are not model computations; they exist to make the store that large.",
        f"- Bytes on disk per token: real artifacts (~{real['tokens'] // max(1, real['artifacts']):,} tokens each) "
        f"{real['bytes_per_token']:,.0f}; synthetic {syn['tokens_per_artifact']:,}-token artifacts {syn['bytes_per_token']:,.0f} "
        f"(full layers {r['layout']['full_bytes_per_token']:,} B/token; sliding layers cap at the window, "
        f"{r['layout']['sliding_bytes_per_artifact_max']:,} B per artifact).",
        f"- Disk: {r['disk']['free_bytes_before'] / 2**30:.0f} GiB free before, store estimated at {r['disk']['estimated_store_bytes'] / 2**30:.1f} GiB. "
        + " ".join(r["notes"]),
        "- Latencies were measured on 2 CPU cores shared with other jobs: differences between levels follow the machine's load, "
        "not the store's size (retrieval is one FAISS search; load and restore touch only the retrieved artifact).",
        "- The temporary store was deleted afterwards." if r.get("cleaned_up") else "- The store was kept (--keep).",
        "",
    ]
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


if __name__ == "__main__":
    sys.exit(main())
