"""How long the packaged Qwen2.5-Coder-1.5B takes to load, kvgraft against llama.cpp, in one run, on the same GGUF
(the file joined into the model cache), 2 threads each.

Every repeat is a fresh process of each engine (medians of `--repeats`):
- `load_s`: the engine's load in a process that has already imported it (kvgraft: torch and transformers, its
  modeling part too, imported, then `graft_core.model.load`, which reads the file, checks its SHA-256 and builds the
  tokenizer (a `--before` checkout older than 2026-12-07 also runs a throw-away forward, `warm_up`); llama.cpp:
  `llama_cpp` imported, then `Llama(model_path=..., n_threads=2)`, which maps the file and touches its weights on
  first use);
- `first_token_s`: then the first greedy token of a short chat prompt (the same token ids both sides: the prompt as
  kvgraft's tokenizer renders it through the model's chat template), and `load_plus_first_token_s`, the fair
  comparison, since llama.cpp's load defers work to its first token (so does kvgraft's now);
- `load_cpu_s`, `load_plus_first_token_cpu_s`: the same spans in CPU seconds of the process (all its threads): the
  work done, which a machine shared with other jobs inflates less than the wall seconds;
- `process_wall_s`: the whole `python -c '<import; load>'`, timed from outside;
- kvgraft's `stages_s`: its load split by stage (functions timed in the child, so the sum is the load's).

`--cold` adds one load from an empty model cache (the 22 parts joined, the config and tokenizer read from the GGUF's
metadata, the weights' fingerprint computed by expanding every tensor) in a temporary KVGRAFT_MODEL_CACHE, and a
kernel cache holding the built kernels but no remembered shape checks, split by stage the same way, then the second
load on those caches (the one that keeps the tokenizer's own file).

    .venv/bin/python -m bench.load [--repeats 3] [--cold] [--before DIR] [--write]

`--before DIR` measures another checkout's kvgraft (e.g. `git archive <commit> | tar -x -C DIR`) alike, in the same
run. `--write` writes docs/bench/load-qwen.json. The machine's load average is recorded at the start and the end: on a
shared machine compare the two engines within one run, not across runs. Without the peer (bench/llamacpp/build.sh)
only kvgraft is measured.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import settings

ROOT = Path(__file__).resolve().parents[1]
MODEL = "packaged:qwen2.5-coder-1.5b-instruct"
PROMPT = [{"role": "user", "content": "What is 12 times 7?"}]
OUT = ROOT / "docs" / "bench" / "load-qwen.json"

# Each stage: (module, attribute, label); the child times every call of each (a nested one is inside its caller).
_STAGES = [
    ("graft_core.packaged", "qwen_path", "join parts (cold) / find file"),
    ("graft_core.packaged", "qwen_file", "qwen_file (join parts cold; SHA-256 of the file)"),
    ("graft_core.packaged.Reading", "bytes", "wait for the file's read + SHA-256"),
    ("transformers.AutoConfig", "from_pretrained", "config (transformers)"),
    ("transformers.AutoTokenizer", "from_pretrained", "tokenizer read by transformers (cold: from the GGUF)"),
    ("graft_core.tokenizer_cache", "load", "tokenizer (kept metadata folder)"),
    ("graft_core.model", "_remember_gguf_metadata", "keep config + tokenizer read from the GGUF"),
    ("graft_core.numerics", "register", "numerics.register (imports transformers' modeling)"),
    ("graft_core.packaged", "skeleton", "skeleton (meta device)"),
    ("graft_core.packaged", "fill", "fill (the blocks: views of the read bytes; copies before)"),
    ("kernels.fma16", "take_over", "fma16.take_over (shape checks)"),
    ("graft_core.model", "_gguf_fingerprints", "fingerprints"),
    ("graft_core.model", "warm_up", "warm_up (throw-away forward)"),
]

_CHILD_CODE = r"""
import importlib, json, sys, time
t = time.perf_counter()
import torch, transformers  # what a process that serves the model has imported before it loads one
import transformers.modeling_utils
imported = time.perf_counter() - t
stages, nested, depth = {}, set(), [0]
if STAGES:
    def timed(owner, attr, label):
        f = getattr(owner, attr)
        def g(*a, **k):
            if depth[0]:  # called inside another timed stage: its seconds are in that stage's too
                nested.add(label)
            depth[0] += 1
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                depth[0] -= 1
                stages[label] = round(stages.get(label, 0.0) + time.perf_counter() - t, 3)
        setattr(owner, attr, g)
    def owner_of(dotted):
        parts = dotted.split(".")
        for i in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                continue
            for p in parts[i:]:
                obj = getattr(obj, p, None)
            return obj
    for mod, attr, label in STAGES:
        owner = owner_of(mod)
        if owner is not None and hasattr(owner, attr):  # a checkout without the stage (--before) skips it
            timed(owner, attr, label)
from graft_core import model
from graft_core.decoding import prefill_alone
from graft_core.forward import new_cache
t, c = time.perf_counter(), time.process_time()
lm = model.load(MODEL)
load, load_cpu = time.perf_counter() - t, time.process_time() - c
ids = lm.tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=True)
ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
t, c = time.perf_counter(), time.process_time()
row = prefill_alone(lm.model, new_cache(lm.model), ids, 0)[-1]
first, first_cpu = time.perf_counter() - t, time.process_time() - c
print(json.dumps({"import_s": imported, "load_s": load, "first_token_s": first, "first_token": int(row.argmax()),
                  "load_cpu_s": load_cpu, "first_token_cpu_s": first_cpu,
                  "prompt_ids": ids, "stages_s": stages, "nested": sorted(nested), "products": lm.products}))
"""

_LLAMA_CHILD = r"""
import json, sys, time
import numpy as np
t = time.perf_counter()
from llama_cpp import Llama
imported = time.perf_counter() - t
t, c = time.perf_counter(), time.process_time()
llm = Llama(model_path=GGUF, n_threads=2, n_threads_batch=2, verbose=False)
load, load_cpu = time.perf_counter() - t, time.process_time() - c
t, c = time.perf_counter(), time.process_time()
llm.eval(IDS)
logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))
first, first_cpu = time.perf_counter() - t, time.process_time() - c
print(json.dumps({"import_s": imported, "load_s": load, "first_token_s": first, "first_token": int(logits.argmax()),
                  "load_cpu_s": load_cpu, "first_token_cpu_s": first_cpu}))
"""


def _env(extra: dict | None = None) -> dict:
    env = dict(os.environ, OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "PASSIVE"))
    env.update(extra or {})
    return env


def _child(python: str, code: str, env: dict | None = None, timeout: float = 3600, cwd: Path = ROOT) -> tuple[dict, float]:
    """Run `code` in a fresh `python` in `cwd` (whose packages it imports); (its last stdout line as JSON, the
    process's wall seconds from outside)."""
    t = time.perf_counter()
    r = subprocess.run([python, "-c", code], capture_output=True, text=True, cwd=cwd, env=env or _env(), timeout=timeout)
    wall = time.perf_counter() - t
    if r.returncode != 0:
        raise RuntimeError(f"the child failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1]), wall


def kvgraft_code(stages: bool) -> str:
    return (
        _CHILD_CODE.replace("STAGES", repr(_STAGES if stages else []))
        .replace("MODEL", repr(MODEL))
        .replace("PROMPT", repr(PROMPT))
    )


def llama_code(gguf: Path, ids: list[int]) -> str:
    return _LLAMA_CHILD.replace("GGUF", repr(str(gguf))).replace("IDS", repr(ids))


def _process_wall(python: str, code: str, cwd: Path = ROOT) -> float:
    return _child(python, code + "\nprint('{}')", cwd=cwd)[1]


def _median(runs: list[dict], key: str) -> float:
    return round(statistics.median(r[key] for r in runs), 3)


def _median_stages(runs: list[dict]) -> dict:
    labels = [label for _, _, label in _STAGES if any(label in r["stages_s"] for r in runs)]
    return {label: round(statistics.median(r["stages_s"].get(label, 0.0) for r in runs), 3) for label in labels}


def cold(python: str) -> dict:
    """One load from an empty model cache (and a kernel cache with the built kernels but no remembered checks)."""
    from kernels import build

    with tempfile.TemporaryDirectory(prefix="kvgraft-cold-load-") as tmp:
        kernels = Path(tmp) / "kernels"
        kernels.mkdir()
        for so in build.kernel_cache_dir().glob("fma16-*.so"):
            shutil.copy2(so, kernels / so.name)
        env = _env({"KVGRAFT_MODEL_CACHE": str(Path(tmp) / "models"), "KVGRAFT_KERNEL_CACHE": str(kernels)})
        out, wall = _child(python, kvgraft_code(True), env)
        second, second_wall = _child(python, kvgraft_code(True), env)  # keeps the tokenizer's own file

    def one(run: dict, wall: float) -> dict:
        return {
            "load_s": round(run["load_s"], 2),
            "process_wall_s": round(wall, 2),
            "stages_s": run["stages_s"],
            "nested_in_another_stage": run["nested"],
            "outside_the_named_stages_s": round(
                run["load_s"] - sum(v for k, v in run["stages_s"].items() if k not in run["nested"]), 2
            ),
            "products": run["products"],
        }

    return {"first_load": one(out, wall), "second_load": one(second, second_wall)}


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cold", action="store_true", help="also one load from an empty model cache, by stage")
    p.add_argument("--peer-python", default=str(settings.get("KVGRAFT_PEER_PYTHON")))
    p.add_argument(
        "--before", type=Path, help="another checkout of kvgraft (an export of an earlier commit) measured alike in the same run"
    )
    p.add_argument("--before-label", default="", help="what --before is (which commit), for the JSON")
    p.add_argument("--write", action="store_true", help=f"write {OUT.relative_to(ROOT)}")
    args = p.parse_args(argv)

    from graft_core import model, packaged

    gguf = packaged.qwen_file(model.model_cache_dir() / "qwen2.5-coder-1.5b-instruct")  # joined (and checked) once
    peer = args.peer_python if Path(args.peer_python).exists() else None
    start_load = loadavg()
    kv_runs, kv_walls, peer_runs, peer_walls, before_runs, before_walls = [], [], [], [], [], []
    wall_code = f"import torch, transformers\nfrom graft_core import model\nmodel.load({MODEL!r})"
    for i in range(args.repeats):  # the engines alternate, so a change in the machine's load falls on both
        out, _ = _child(sys.executable, kvgraft_code(True))
        kv_runs.append(out)
        kv_walls.append(_process_wall(sys.executable, wall_code))
        if args.before:
            before_runs.append(_child(sys.executable, kvgraft_code(True), cwd=args.before)[0])
            before_walls.append(_process_wall(sys.executable, wall_code, cwd=args.before))
        if peer:
            got, _ = _child(peer, llama_code(gguf, out["prompt_ids"]))
            peer_runs.append(got)
            peer_walls.append(
                _process_wall(peer, f"from llama_cpp import Llama\nLlama(model_path={str(gguf)!r}, n_threads=2, verbose=False)")
            )
        print(f"repeat {i + 1}/{args.repeats}: kvgraft load {out['load_s']:.2f} s", file=sys.stderr)

    def side(runs: list[dict], walls: list[float]) -> dict:
        return {
            "import_s": _median(runs, "import_s"),
            "load_s": _median(runs, "load_s"),
            "first_token_s": _median(runs, "first_token_s"),
            "load_plus_first_token_s": round(statistics.median(r["load_s"] + r["first_token_s"] for r in runs), 3),
            "load_cpu_s": _median(runs, "load_cpu_s"),
            "load_plus_first_token_cpu_s": round(statistics.median(r["load_cpu_s"] + r["first_token_cpu_s"] for r in runs), 3),
            "process_wall_s": round(statistics.median(walls), 3),
            "first_token": [r["first_token"] for r in runs],
            "runs_load_s": [round(r["load_s"], 3) for r in runs],
        }

    result = {
        "benchmark": "load",
        "date": dt.date.today().isoformat(),
        "model": MODEL,
        "gguf": {"path": str(gguf), "bytes": gguf.stat().st_size, "sha256": packaged.QWEN_SHA256},
        "repeats": args.repeats,
        "threads": 2,
        "prompt_tokens": len(kv_runs[0]["prompt_ids"]),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "load_average": {"start": start_load, "end": loadavg()},
        "note": (
            "a shared machine (a long-running evaluation beside it): compare the engines within this run, not across "
            "runs; each repeat is a fresh process of each engine, medians"
        ),
        "kvgraft": side(kv_runs, kv_walls) | {"stages_s": _median_stages(kv_runs), "products": kv_runs[0]["products"]},
    }
    if args.before:
        result["kvgraft_before"] = side(before_runs, before_walls) | {
            "checkout": args.before_label or str(args.before),
            "stages_s": _median_stages(before_runs),
        }
    if peer:
        result["llama_cpp"] = side(peer_runs, peer_walls) | {"python": peer, "call": "Llama(model_path, n_threads=2)"}
        kv, lc = result["kvgraft"], result["llama_cpp"]
        keys = ("load_s", "load_plus_first_token_s", "process_wall_s", "load_cpu_s", "load_plus_first_token_cpu_s")
        result["ratio_kvgraft_over_llama_cpp"] = {k: round(kv[k] / lc[k], 2) for k in keys if lc[k]}
        if args.before:
            before = result["kvgraft_before"]
            result["ratio_kvgraft_before_over_llama_cpp"] = {k: round(before[k] / lc[k], 2) for k in keys if lc[k]}
    else:
        result["llama_cpp"] = f"not measured: no peer python at {args.peer_python} (bench/llamacpp/build.sh)"
    if args.cold:
        result["cold"] = cold(sys.executable)
    text = json.dumps(result, indent=2)
    print(text)
    if args.write:
        OUT.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
