"""Engine benchmarks on the default model: time to first token grafted vs fresh prefill, restore vs a
raw read of the same bytes, and artifact bytes per token vs the raw KV bytes.

Ratios are measured within one run (the machine is shared and noisy) and reported as medians.
Writes docs/bench/engine.json and prints a markdown table.  Usage:
    .venv/bin/python -m bench.ttft [--lengths 512,1024,2048,4096,8192,16384] [--repeats 3]
    .venv/bin/python -m bench.ttft --numerics [--rounds 2]   # kernel-path study, see docs/DETERMINISM.md

The numerics study runs each candidate pin (ATen capability, MKL reproducibility modes, threads,
oneDNN) in a fresh process (the settings only apply before torch/MKL start) and records which change
the bits of a 512-token artifact and a question's logits, and what each costs relative to the
default run of the same round (prefill of 512 tokens, a question forward after the graft).
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from db.blobs import BlobStore  # noqa: E402
from graft_core import codec, generate, model  # noqa: E402
from graft_core.capture import capture  # noqa: E402
from graft_core.forward import forward_chunk, new_cache  # noqa: E402
from graft_core.graft import restore  # noqa: E402

CORPUS = (
    "The harbour town of Quenmora keeps a ledger of every ship that docks: its name, its captain, "
    "the cargo it carries and the day it leaves. In the year of the long winter the ledger recorded "
    "{i} ships, each with salt, timber or wool, and the harbour master, a careful man named Osric "
    "Pellamy, wrote a note beside entry {i} about the weather and the tides. "
)


def text_tokens(lm, n: int) -> list[int]:
    ids: list[int] = [lm.tokenizer.bos_token_id]
    i = 0
    while len(ids) < n:
        ids += lm.tokenizer(CORPUS.format(i=i), add_special_tokens=False)["input_ids"]
        i += 1
    return ids[:n]


def drop_page_cache(path: Path) -> bool:
    """Evict one file from the page cache (cold read) where the OS allows it."""
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        return True
    except (AttributeError, OSError):
        return False


def raw_read(path: Path) -> float:
    t0 = time.perf_counter()
    with open(path, "rb") as f:
        data = bytearray(os.fstat(f.fileno()).st_size)
        f.readinto(data)
    return time.perf_counter() - t0


def read_and_restore(lm, store: BlobStore, h: str, rehash: bool = False) -> float:
    """What a graft costs from disk: read + integrity check + decode + restore into a cache. The check is
    the store's: SHA-256 on a file's first read, the file identity after it (`rehash`: SHA-256 always)."""
    t0 = time.perf_counter()
    art = codec.loads(store.get(h, rehash=rehash))
    restore(lm, [art])
    return time.perf_counter() - t0


def read_and_restore_unhashed(lm, path: Path) -> float:
    """The same without the SHA-256 check, to show what the integrity check itself costs."""
    t0 = time.perf_counter()
    with open(path, "rb") as f:
        data = bytearray(os.fstat(f.fileno()).st_size)
        f.readinto(data)
    restore(lm, [codec.loads(data)])
    return time.perf_counter() - t0


NUMERICS_RUNS = {  # name: (environment, threads or None, oneDNN enabled)
    "default": ({}, None, True),
    "aten_default": ({"ATEN_CPU_CAPABILITY": "default"}, None, True),
    "aten_avx2": ({"ATEN_CPU_CAPABILITY": "avx2"}, None, True),
    "mkl_cbwr_compatible": ({"MKL_CBWR": "COMPATIBLE"}, None, True),
    "mkl_cbwr_avx2": ({"MKL_CBWR": "AVX2"}, None, True),
    "mkl_enable_instructions_avx2": ({"MKL_ENABLE_INSTRUCTIONS": "AVX2"}, None, True),
    "threads_1": ({"KVGRAFT_THREADS": "1"}, 1, True),
    "mkldnn_off": ({}, None, False),
}
QUESTION = "Who was the harbour master of Quenmora?"


def numerics_child(name: str) -> dict:
    """One kernel-path candidate in this (fresh) process: bit hashes and medians."""
    _, threads, mkldnn = NUMERICS_RUNS[name]
    if threads:
        torch.set_num_threads(threads)
    torch.backends.mkldnn.enabled = mkldnn
    from graft_core.probe import logits_sha256

    lm = model.load()
    ids = text_tokens(lm, 512)
    q_ids = generate.encode_prompt(lm, QUESTION, grafted=True)
    art, _ = capture(lm, ids)
    kv = hashlib.sha256()
    for t in (*art.keys, *art.values):
        kv.update(t.contiguous().numpy().tobytes())
    q_logits = forward_chunk(lm.model, restore(lm, [art]), q_ids, art.end, all_logits=True)
    prefill, question = [], []
    for _ in range(3):
        t = time.perf_counter()
        forward_chunk(lm.model, new_cache(lm.model), ids, 0)
        prefill.append(time.perf_counter() - t)
        cache = restore(lm, [art])
        t = time.perf_counter()
        forward_chunk(lm.model, cache, q_ids, art.end)
        question.append(time.perf_counter() - t)
    return {
        "name": name,
        "numerics": lm.config.as_dict()["numerics"],
        "threads": torch.get_num_threads(),
        "kv_sha256": kv.hexdigest(),  # the artifact's tensors only: comparable across fingerprints
        "artifact_sha256": hashlib.sha256(codec.dumps(art)).hexdigest(),
        "question_logits_sha256": logits_sha256(q_logits),
        "question_tokens": len(q_ids),
        "prefill_512_s": statistics.median(prefill),
        "question_s": statistics.median(question),
    }


def numerics_study(rounds: int, out: Path) -> None:
    """Every candidate in its own process, rounds interleaved; ratios against the same round's default."""
    import subprocess

    results: dict[str, list[dict]] = {n: [] for n in NUMERICS_RUNS}
    for _ in range(rounds):
        for name, (env, _, _) in NUMERICS_RUNS.items():
            r = subprocess.run(
                [sys.executable, "-m", "bench.ttft", "--numerics-child", name],
                env={**os.environ, **env},
                cwd=ROOT,
                capture_output=True,
                text=True,
                check=True,
            )
            results[name].append(json.loads(r.stdout.strip().splitlines()[-1]))
            print(results[name][-1], flush=True)
    base = results["default"]
    rows = []
    for runs in results.values():
        rows.append(
            {
                **{k: runs[0][k] for k in ("name", "numerics", "threads", "kv_sha256", "question_logits_sha256")},
                "bits_equal_default": all(
                    r["kv_sha256"] == b["kv_sha256"] and r["question_logits_sha256"] == b["question_logits_sha256"]
                    for r, b in zip(runs, base)
                ),
                "prefill_512_over_default": statistics.median(
                    r["prefill_512_s"] / b["prefill_512_s"] for r, b in zip(runs, base)
                ),
                "question_over_default": statistics.median(r["question_s"] / b["question_s"] for r, b in zip(runs, base)),
                "prefill_512_s": statistics.median(r["prefill_512_s"] for r in runs),
                "question_s": statistics.median(r["question_s"] for r in runs),
            }
        )
    doc = json.loads(out.read_text()) if out.exists() else {"benchmark": "engine"}
    doc["numerics"] = {
        "command": f".venv/bin/python -m bench.ttft --numerics --rounds {rounds}",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_avg": os.getloadavg()},
        "note": "each candidate in a fresh process; ratios are medians over rounds of (candidate / default of the same round)",
        "rows": rows,
    }
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print("\n| candidate | bits equal default | prefill 512 vs default | question vs default |\n|---|---|---:|---:|")
    for r in rows:
        print(
            f"| {r['name']} | {r['bits_equal_default']} | {r['prefill_512_over_default']:.2f}x | {r['question_over_default']:.2f}x |"
        )


def _ttft(lm, store: BlobStore, h: str, ids: list[int], q_ids: list[int], reps: int) -> tuple[list, list, bool]:
    """First-token seconds fresh and grafted, alternating, and whether both chose the same first token."""
    path = store.path(h)
    fresh, graft = [], []
    tok_fresh = tok_graft = None
    for _ in range(reps):
        # fresh: prefix + query prefilled from scratch (logits_to_keep=1), first token chosen
        t = time.perf_counter()
        row = forward_chunk(lm.model, new_cache(lm.model), ids + q_ids, 0)[-1]
        tok_fresh = int(torch.argmax(row))
        fresh.append(time.perf_counter() - t)
        # grafted: read + hash-check + decode + restore + query forward + first token
        drop_page_cache(path)
        t = time.perf_counter()
        a = codec.loads(store.get(h))
        cache = restore(lm, [a])
        row = forward_chunk(lm.model, cache, q_ids, a.end)[-1]
        tok_graft = int(torch.argmax(row))
        graft.append(time.perf_counter() - t)
    return fresh, graft, tok_fresh == tok_graft


def _restores(lm, store: BlobStore, h: str, reps: int) -> dict[str, list[float]]:
    """Seconds of a raw read and of read-and-restore, cold and warm, with the store's check, SHA-256 on
    every read, and none."""
    path = store.path(h)
    kinds = ("cold_read", "cold_restore", "warm_read", "warm_restore", "warm_nohash", "warm_hashed")
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(max(3, reps)):
        drop_page_cache(path)
        times["cold_read"].append(raw_read(path))
        drop_page_cache(path)
        times["cold_restore"].append(read_and_restore(lm, store, h))
        times["warm_read"].append(raw_read(path))
        times["warm_restore"].append(read_and_restore(lm, store, h))
        times["warm_nohash"].append(read_and_restore_unhashed(lm, path))
        times["warm_hashed"].append(read_and_restore(lm, store, h, rehash=True))
    return times


def _measure(lm, store: BlobStore, q_ids: list[int], n: int, repeats: int) -> dict:
    """One prefix length: capture and store its artifact, then time first tokens and restores."""
    reps = repeats if n <= 4096 else 1
    ids = text_tokens(lm, n)
    t0 = time.perf_counter()
    art, stats = capture(lm, ids)
    data = codec.dumps(art)
    h = store.put(data)
    path = store.path(h)
    # Measure a settled artifact, as an answer serves one: the store trusts a file's identity only
    # when it hashed the file at least racy_ns after its last change (db/blobs.py). With a fast
    # capture the first warm reads would otherwise come too early and hash every time.
    time.sleep(max(0.0, (store.racy_ns - (time.time_ns() - os.stat(path).st_ctime_ns)) / 1e9 + 0.1))
    fresh, graft, same_token = _ttft(lm, store, h, ids, q_ids, reps)
    r = _restores(lm, store, h, reps)
    med = statistics.median
    row = {
        "prefix_tokens": n,
        "query_tokens": len(q_ids),
        "repeats": reps,
        "capture_prefill_s": stats.prefill_s,
        "ttft_fresh_s": med(fresh),
        "ttft_grafted_s": med(graft),
        "ttft_speedup": med(fresh) / med(graft),
        "first_token_equal": same_token,
        "file_bytes": len(data),
        "kv_bytes": art.kv_bytes(),
        "bytes_per_token": len(data) / n,
        "file_over_kv": len(data) / art.kv_bytes(),
        "raw_read_warm_s": med(r["warm_read"]),
        "restore_warm_s": med(r["warm_restore"]),
        "restore_over_read_warm": med(r["warm_restore"]) / med(r["warm_read"]),
        "restore_hashed_warm_s": med(r["warm_hashed"]),
        "restore_hashed_over_read_warm": med(r["warm_hashed"]) / med(r["warm_read"]),
        "restore_unhashed_warm_s": med(r["warm_nohash"]),
        "restore_unhashed_over_read_warm": med(r["warm_nohash"]) / med(r["warm_read"]),
        "raw_read_cold_s": med(r["cold_read"]),
        "restore_cold_s": med(r["cold_restore"]),
        "restore_over_read_cold": med(r["cold_restore"]) / med(r["cold_read"]),
        "artifact_sha256": hashlib.sha256(data).hexdigest(),
        "wall_s": time.perf_counter() - t0,
    }
    store.delete(h)
    return row


def _write_json(out_path: Path, lm, rows: list[dict]) -> None:
    """The run's document; the numerics section of the previous one is kept (that study is its own run)."""
    out = {
        "benchmark": "engine",
        "command": "make bench  (.venv/bin/python -m bench.ttft)",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
        },
        "model": lm.info.name,
        "model_fingerprint": lm.fingerprint,
        "config": lm.config.as_dict(),
        "targets": {"ttft_speedup_at_4096": ">= 50", "restore_over_read": "<= 1.5", "file_over_kv": "<= 1.01"},
        "note": "ttft_grafted includes blob read (page cache dropped), integrity check, decode, restore, query forward and "
        "the first token; ttft_fresh is one prefill of prefix+query with logits_to_keep=1. restore_* use the store's check "
        "(SHA-256 on a file's first read, then its unchanged identity: db/blobs.py), restore_hashed_* SHA-256 every read, "
        "restore_unhashed_* no check. Medians.",
        "rows": rows,
    }
    if out_path.exists() and "numerics" in (old := json.loads(out_path.read_text())):
        out["numerics"] = old["numerics"]  # the kernel-path study is its own run (--numerics)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(out, indent=2) + "\n")


def _print_table(rows: list[dict]) -> None:
    print(
        "\n| prefix tokens | TTFT fresh (s) | TTFT grafted (s) | speedup | restore/read warm | hashed every read | "
        "restore/read cold | file/KV bytes |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['prefix_tokens']:,} | {r['ttft_fresh_s']:.3f} | {r['ttft_grafted_s']:.3f} | {r['ttft_speedup']:.1f}x | "
            f"{r['restore_over_read_warm']:.2f}x | {r['restore_hashed_over_read_warm']:.2f}x | "
            f"{r['restore_over_read_cold']:.2f}x | {r['file_over_kv']:.4f} |"
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--numerics", action="store_true", help="run the kernel-path study instead (writes the numerics section)")
    ap.add_argument("--numerics-child", choices=sorted(NUMERICS_RUNS), help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--lengths", default="512,1024,2048,4096,8192,16384")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "docs" / "bench" / "engine.json"))
    args = ap.parse_args()
    if args.numerics_child:
        print(json.dumps(numerics_child(args.numerics_child)))
        return
    if args.numerics:
        numerics_study(args.rounds, Path(args.out))
        return
    lengths = [int(x) for x in args.lengths.split(",")]
    lm = model.load()
    q_ids = generate.encode_prompt(lm, QUESTION, grafted=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="kvgraft-bench-") as tmp:
        store = BlobStore(Path(tmp) / "blobs")
        # warm-up: the first forward of a process pays one-off costs
        forward_chunk(lm.model, new_cache(lm.model), text_tokens(lm, 64), 0)
        for n in lengths:
            rows.append(_measure(lm, store, q_ids, n, args.repeats))
            print(json.dumps(rows[-1]), flush=True)
    _write_json(Path(args.out), lm, rows)
    _print_table(rows)


if __name__ == "__main__":
    main()
