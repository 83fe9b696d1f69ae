"""retrieval/: the real embedder (loaded once for this module), the FAISS index, its persistence.

The 20 question/paraphrase pairs and 5 off-topic questions below are also the data behind
DEFAULT_THRESHOLD (numbers in retrieval/index.py's docstring).
"""

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import faiss  # noqa: F401  (before graft_core pulls in torch: see retrieval/__init__.py)
import numpy as np
import pytest

from errors import IntegrityError, InvalidInput
from retrieval import DEFAULT_THRESHOLD, HashEmbedder, Hit, SentenceEmbedder, VectorIndex
from retrieval.embedder import MAX_CHARS

PAIRS = [
    (
        "What is the boiling point of water at sea level in Celsius?",
        "At sea level, at what temperature in degrees Celsius does water boil?",
    ),
    ("How many prime numbers are there below 100?", "Count the primes smaller than one hundred."),
    ("What is the derivative of x squared times sine of x?", "Differentiate x^2 sin(x) with respect to x."),
    ("Who wrote the novel Pride and Prejudice?", "Which author is responsible for Pride and Prejudice?"),
    ("How do I reset a forgotten password on the admin console?", "I forgot my admin console password; how can I reset it?"),
    ("What is the capital city of Australia?", "Which city is Australia's capital?"),
    ("How many seconds are there in a leap year?", "Compute the number of seconds in a leap year."),
    ("What is the speed of light in a vacuum?", "How fast does light travel in vacuum?"),
    ("How do you restart the nginx web server on Ubuntu?", "What command restarts nginx on an Ubuntu machine?"),
    (
        "What is the sum of the interior angles of a hexagon?",
        "Add up the interior angles of a six-sided polygon: what do you get?",
    ),
    ("Which enzyme breaks down starch in human saliva?", "What enzyme in saliva digests starch?"),
    ("What is the time complexity of binary search?", "How does the running time of binary search scale with input size?"),
    ("When did the Berlin Wall fall?", "In what year was the Berlin Wall torn down?"),
    ("What is the chemical formula of table salt?", "Give the chemical formula for sodium chloride, common salt."),
    ("How do I rotate the API keys for the billing service?", "What is the procedure to replace the billing service's API keys?"),
    ("What is 17 multiplied by 23?", "Compute the product of seventeen and twenty-three."),
    ("What is the largest planet in the solar system?", "Which planet in our solar system is the biggest?"),
    ("How many bones does an adult human have?", "What is the number of bones in the adult human skeleton?"),
    ("What is the integral of one over x?", "Find the antiderivative of 1/x."),
    ("Which gas do plants absorb during photosynthesis?", "During photosynthesis, what gas is taken in by plants?"),
]
OFF_TOPIC = [
    "What's a good recipe for banana bread?",
    "Can you recommend a fantasy novel for a teenager?",
    "How do I tie a bowline knot?",
    "What are the rules of cricket?",
    "Tell me a joke about cats.",
]
MARGIN = 0.05  # DEFAULT_THRESHOLD must sit at least this far from both sides


@pytest.fixture(scope="module")
def embedder():
    return SentenceEmbedder()


@pytest.fixture(scope="module")
def items(embedder):
    """The deposited side: (id, vector) for each question; queries are the paraphrases."""
    vectors = embedder.embed_batch([q for q, _ in PAIRS])
    return [(f"item-{i:02d}", v) for i, v in enumerate(vectors)]


@pytest.fixture(scope="module")
def catalog_index(embedder, items):
    index = VectorIndex(embedder.dim, embedder.embedder_id)
    index.build(items, version=1)
    return index


def unit_rows(n, dim=32, seed=0):
    x = np.random.default_rng(seed).standard_normal((n, dim), dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def small_index(n=50, dim=32, hnsw_threshold=20_000, version=1):
    index = VectorIndex(dim, "fake@0", hnsw_threshold=hnsw_threshold)
    vectors = unit_rows(n, dim)
    index.build(((f"a{i}", v) for i, v in enumerate(vectors)), version)
    return index, vectors


# -- the real embedder -----------------------------------------------------------------------------


def test_embedder_identity_and_shape(embedder):
    assert embedder.dim == 384
    assert embedder.max_seq_length == 256
    name, rest = embedder.embedder_id.split("@")
    digest, numerics = rest.split("+")
    assert name == "all-MiniLM-L6-v2" and len(digest) == 16 and int(digest, 16) >= 0 and numerics == "kvgraft-enc-v1"
    assert embedder.embed_batch([]).shape == (0, 384)


def test_vectors_are_normalised(embedder):
    vectors = embedder.embed_batch([q for q, _ in PAIRS] + [""])
    assert vectors.dtype == np.float32 and vectors.shape == (len(PAIRS) + 1, 384)
    norms = np.linalg.norm(vectors.astype(np.float64), axis=1)
    assert np.abs(norms - 1).max() < 1e-5, norms


def test_embed_is_deterministic_and_batch_independent(embedder):
    text = PAIRS[0][0]
    first, second = embedder.embed(text), embedder.embed(text)
    assert first.tobytes() == second.tobytes(), np.abs(first - second).max()
    in_batch = embedder.embed_batch([PAIRS[5][1], text, "a much longer text " * 20])[1]
    assert in_batch.tobytes() == first.tobytes(), np.abs(in_batch - first).max()


def test_long_input_is_truncated(embedder):
    long = "The billing service keys rotate monthly. " * 2000
    assert len(long) > MAX_CHARS
    assert embedder.embed(long).tobytes() == embedder.embed(long[:MAX_CHARS]).tobytes()


def test_embed_rejects_non_text(embedder):
    with pytest.raises(InvalidInput) as e:
        embedder.embed_batch(["ok", 3])
    assert str(e.value) == "embed_batch expects a list of str; item 1 is int"
    with pytest.raises(InvalidInput) as e:
        embedder.embed_batch("one string")
    assert str(e.value) == "embed_batch expects a list of str, got one str; use embed(text) for a single text"


def test_lazy_load_happens_once_under_concurrency(monkeypatch):
    import sentence_transformers

    calls = []
    real = sentence_transformers.SentenceTransformer

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(sentence_transformers, "SentenceTransformer", counting)
    fresh = SentenceEmbedder()
    assert calls == []  # constructing loads nothing
    out = [None] * 4
    barrier = threading.Barrier(4)

    def worker(i):
        barrier.wait()
        out[i] = fresh.embed(PAIRS[0][0]).tobytes()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert len(set(out)) == 1


# -- retrieval quality and the threshold -------------------------------------------------------------


def test_paraphrase_ranks_the_right_item_first(embedder, catalog_index):
    for i, (_, paraphrase) in enumerate(PAIRS):
        hits = catalog_index.search(embedder.embed(paraphrase), k=3)
        assert hits, f"no hit for {paraphrase!r}"
        assert hits[0] == Hit(f"item-{i:02d}", hits[0].score, 1), (paraphrase, hits)
        assert [h.rank for h in hits] == list(range(1, len(hits) + 1))
        assert all(a.score >= b.score for a, b in zip(hits, hits[1:], strict=False))


def test_threshold_separates_paraphrases_from_unrelated(embedder, items):
    stored = np.stack([v for _, v in items])
    paraphrases = embedder.embed_batch([p for _, p in PAIRS])
    sims = paraphrases @ stored.T
    matched = np.diag(sims)
    crossed = sims[~np.eye(len(PAIRS), dtype=bool)]
    off_topic = embedder.embed_batch(OFF_TOPIC) @ stored.T
    report = (
        f"paraphrase min {matched.min():.3f} median {np.median(matched):.3f}; "
        f"cross max {crossed.max():.3f}; off-topic max {off_topic.max():.3f}; threshold {DEFAULT_THRESHOLD}"
    )
    assert matched.min() >= DEFAULT_THRESHOLD + MARGIN, report
    assert crossed.max() < DEFAULT_THRESHOLD - MARGIN, report
    assert off_topic.max() < DEFAULT_THRESHOLD - MARGIN, report


def test_unrelated_query_returns_nothing(embedder, catalog_index):
    for question in OFF_TOPIC:
        assert catalog_index.search(embedder.embed(question), k=5) == [], question


# -- the index ----------------------------------------------------------------------------------------


def test_search_basics():
    index, vectors = small_index()
    assert len(index) == 50 and index.kind == "flat" and "a3" in index
    hits = index.search(vectors[3], k=5, threshold=-1.0)
    assert len(hits) == 5 and hits[0].artifact_id == "a3" and hits[0].rank == 1
    assert abs(hits[0].score - 1.0) < 1e-5
    assert len(index.search(vectors[3], k=500, threshold=-1.0)) == 50
    assert index.search(vectors[3], k=5, threshold=1.01) == []
    assert VectorIndex(32, "fake@0").search(vectors[0]) == []


def test_search_normalises_the_query():
    index, vectors = small_index()
    assert index.search(vectors[7] * 3.0, k=1, threshold=-1.0) == index.search(vectors[7], k=1, threshold=-1.0)


def test_invalid_inputs_have_clear_messages():
    index, vectors = small_index()
    cases = [
        (lambda: index.search(np.ones(31, np.float32)), "query vector must have shape [32] for this index, got [31]"),
        (lambda: index.search(vectors[:2]), "query vector must have shape [32] for this index, got [2, 32]"),
        (lambda: index.search(vectors[0], k=0), "k must be >= 1, got 0"),
        (lambda: index.add("x", np.zeros(32)), "vector contains an all-zero vector, which has no direction"),
        (lambda: index.add("x", np.full(32, np.nan)), "vector contains NaN or infinity"),
        (lambda: index.add("", vectors[0]), "artifact ids must be non-empty str, got ''"),
        (
            lambda: index.build([("a", vectors[0]), ("a", vectors[1])], 2),
            "artifact id 'a' appears twice in build(); ids must be unique",
        ),
        (lambda: index.build([("a", vectors[0]), ("b", vectors[1][:5])], 2), "the vector for 'b' must have shape [32], got [5]"),
    ]
    for call, message in cases:
        with pytest.raises(InvalidInput) as e:
            call()
        assert str(e.value) == message


def test_add_and_replace():
    index, vectors = small_index(n=10)
    extra = unit_rows(2, seed=9)
    index.add("new", extra[0], version=2)
    assert len(index) == 11 and index.version == 2
    assert index.search(extra[0], k=1)[0].artifact_id == "new"
    index.add("new", extra[1])  # same id: replaced, not duplicated
    assert len(index) == 11
    assert index.search(extra[1], k=1)[0].artifact_id == "new"
    assert index.search(extra[0], k=1, threshold=0.99) == []


def test_add_after_remove_in_hnsw():
    index, vectors = small_index(n=10, hnsw_threshold=5)
    index.remove("a3")
    index.add("a3", vectors[3])  # a new row after a tombstone: it must be searchable
    index.add("b", vectors[4] + 0.1)
    assert len(index) == 11
    assert index.search(vectors[3], k=1)[0].artifact_id == "a3"
    assert {h.artifact_id for h in index.search(vectors[4], k=2)} == {"a4", "b"}


@pytest.mark.parametrize("threshold", [20_000, 5], ids=["flat", "hnsw"])
def test_remove(threshold):
    index, vectors = small_index(n=30, hnsw_threshold=threshold)
    assert index.kind == ("flat" if threshold > 30 else "hnsw")
    assert index.remove("a4", version=2) is True
    assert index.remove("a4") is False
    assert len(index) == 29 and "a4" not in index and index.version == 2
    assert all(h.artifact_id != "a4" for h in index.search(vectors[4], k=30, threshold=-1.0))
    assert len(index.search(vectors[4], k=30, threshold=-1.0)) == 29
    for i in (0, 5, 29):  # rows after the removed one still map to the right ids
        assert index.search(vectors[i], k=1)[0].artifact_id == f"a{i}"


def test_add_crosses_into_hnsw():
    index, vectors = small_index(n=8, hnsw_threshold=8)
    assert index.kind == "flat"
    index.remove("a2")
    index.add("a8", unit_rows(1, seed=5)[0])
    assert index.kind == "flat" and len(index) == 8
    index.add("a9", unit_rows(1, seed=6)[0])
    assert index.kind == "hnsw" and len(index) == 9 and "a2" not in index
    for i in (0, 7):
        assert index.search(vectors[i], k=1)[0].artifact_id == f"a{i}"
    assert index.search(unit_rows(1, seed=6)[0], k=1)[0].artifact_id == "a9"


def test_hnsw_and_flat_agree_on_top1():
    n, dim = 3000, 384
    stored = unit_rows(n, dim, seed=1)
    pairs = [(f"a{i}", v) for i, v in enumerate(stored)]
    flat = VectorIndex(dim, "fake@0")
    flat.build(pairs, 1)
    hnsw = VectorIndex(dim, "fake@0", hnsw_threshold=1000)
    hnsw.build(pairs, 1)
    assert (flat.kind, hnsw.kind) == ("flat", "hnsw")
    rng = np.random.default_rng(2)
    near = stored[:300] + 0.05 * rng.standard_normal((300, dim), dtype=np.float32)  # cosine ~0.7 to its source
    far = rng.standard_normal((300, dim), dtype=np.float32)  # arbitrary directions: HNSW's worst case

    def top1(index, queries):
        return [index.search(q, k=1, threshold=-1.0)[0].artifact_id for q in queries]

    assert top1(hnsw, near) == top1(flat, near) == [f"a{i}" for i in range(300)]
    agree = np.mean([a == b for a, b in zip(top1(hnsw, far), top1(flat, far), strict=True)])
    assert agree >= 0.97, agree


def test_is_stale():
    index, _ = small_index(version=7)
    assert not index.is_stale(7, "fake@0")
    assert index.is_stale(8, "fake@0")
    assert index.is_stale(7, "all-MiniLM-L6-v2@0123456789abcdef")
    assert index.is_stale("7", "fake@0")
    assert VectorIndex(32, "fake@0").is_stale(0, "fake@0")  # never built
    index.add("x", unit_rows(1, seed=3)[0], version=8)
    assert not index.is_stale(8, "fake@0")


# -- persistence -------------------------------------------------------------------------------------


@pytest.mark.parametrize("threshold", [20_000, 5], ids=["flat", "hnsw"])
def test_save_load_round_trip(tmp_path, threshold):
    index, vectors = small_index(n=40, hnsw_threshold=threshold, version="v3")
    index.remove("a1")
    queries = unit_rows(10, seed=4)
    before = [index.search(q, k=5, threshold=-1.0) for q in [*queries, vectors[1]]]
    index.save(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index.faiss", "index.json"]
    meta = json.loads((tmp_path / "index.json").read_text())
    assert (meta["count"], meta["dim"], meta["embedder_id"], meta["catalog_version"], meta["kind"]) == (
        39,
        32,
        "fake@0",
        "v3",
        index.kind,
    )
    loaded = VectorIndex.load(tmp_path)
    after = [loaded.search(q, k=5, threshold=-1.0) for q in [*queries, vectors[1]]]
    assert after == before
    assert (len(loaded), loaded.kind, loaded.dim, loaded.version) == (39, index.kind, 32, "v3")
    assert not loaded.is_stale("v3", "fake@0")
    loaded.add("a1", vectors[1])  # still mutable after a load
    assert loaded.search(vectors[1], k=1)[0].artifact_id == "a1"


def test_real_embeddings_round_trip(tmp_path, embedder, catalog_index):
    catalog_index.save(tmp_path)
    loaded = VectorIndex.load(tmp_path)
    assert not loaded.is_stale(1, embedder.embedder_id)
    query = embedder.embed(PAIRS[3][1])
    assert loaded.search(query) == catalog_index.search(query)


def _saved(tmp_path: Path) -> Path:
    index, _ = small_index(n=10)
    index.save(tmp_path)
    return tmp_path


def test_load_missing_index(tmp_path):
    with pytest.raises(IntegrityError) as e:
        VectorIndex.load(tmp_path / "nowhere")
    assert str(e.value) == (
        f"no vector index at {tmp_path / 'nowhere'}: index.json is missing; "
        "rebuild the index from the catalog (VectorIndex.build) and save it again"
    )
    (_saved(tmp_path) / "index.faiss").unlink()
    with pytest.raises(IntegrityError) as e:
        VectorIndex.load(tmp_path)
    assert str(e.value) == (
        f"{tmp_path / 'index.faiss'} is missing or unreadable; rebuild the index from the catalog (VectorIndex.build) and save it again"
    )


def test_load_corrupt_faiss_file(tmp_path):
    path = _saved(tmp_path) / "index.faiss"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(IntegrityError) as e:
        VectorIndex.load(tmp_path)
    assert str(e.value) == (
        f"{path} does not match the SHA-256 recorded in index.json (corrupt or half-written); "
        "rebuild the index from the catalog (VectorIndex.build) and save it again"
    )


def test_load_truncated_faiss_file_with_matching_hash(tmp_path):
    """A hash that matches garbage (rewritten JSON) still fails cleanly in FAISS's reader."""
    folder = _saved(tmp_path)
    data = (folder / "index.faiss").read_bytes()[:100]
    (folder / "index.faiss").write_bytes(data)
    meta = json.loads((folder / "index.json").read_text())
    meta["faiss_sha256"] = __import__("hashlib").sha256(data).hexdigest()
    (folder / "index.json").write_text(json.dumps(meta))
    with pytest.raises(IntegrityError, match=r"index\.faiss is not a FAISS index"):
        VectorIndex.load(folder)


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda m: m.update(format="kvgraft-index/0"), "format"),
        (lambda m: m.update(dim="32"), "dim"),
        (lambda m: m.update(ids=m["ids"] + [5]), "ids"),
        (lambda m: m.update(count=11), "count"),
        (lambda m: m.pop("embedder_id"), "embedder_id"),
    ],
)
def test_load_malformed_json(tmp_path, edit, field):
    folder = _saved(tmp_path)
    meta = json.loads((folder / "index.json").read_text())
    edit(meta)
    (folder / "index.json").write_text(json.dumps(meta))
    with pytest.raises(IntegrityError) as e:
        VectorIndex.load(folder)
    assert str(e.value) == (
        f"{folder / 'index.json'} has a missing or malformed {field!r}; "
        "rebuild the index from the catalog (VectorIndex.build) and save it again"
    )


def test_load_inconsistent_ids(tmp_path):
    folder = _saved(tmp_path)
    meta = json.loads((folder / "index.json").read_text())
    meta["ids"] = meta["ids"][:-1]
    meta["count"] = len(meta["ids"])
    (folder / "index.json").write_text(json.dumps(meta))
    with pytest.raises(IntegrityError, match="does not hold the flat index index.json describes"):
        VectorIndex.load(folder)


def test_load_non_json(tmp_path):
    folder = _saved(tmp_path)
    (folder / "index.json").write_bytes(b"\x00not json")
    with pytest.raises(IntegrityError, match=r"index\.json is not readable JSON"):
        VectorIndex.load(folder)


# -- the fake and the import order --------------------------------------------------------------------


def test_hash_embedder():
    fake = HashEmbedder(dim=64)
    assert (fake.dim, fake.embedder_id) == (64, "hash-64@1")
    vectors = fake.embed_batch(["reset the admin password", "admin password reset please", "banana bread", "", "!!"])
    assert vectors.shape == (5, 64) and vectors.dtype == np.float32
    assert np.abs(np.linalg.norm(vectors, axis=1) - 1).max() < 1e-6
    assert fake.embed("reset the admin password").tobytes() == vectors[0].tobytes()
    assert vectors[0] @ vectors[1] > 0.5 > abs(vectors[0] @ vectors[2])
    assert HashEmbedder(dim=64).embed("x").tobytes() == fake.embed("x").tobytes()


def test_torch_then_retrieval_in_a_fresh_process():
    """faiss#3401: importing faiss after torch segfaulted on macOS. On Linux this order must work."""
    code = (
        "import torch, numpy as np\n"
        "import retrieval\n"
        "v = np.eye(4, dtype=np.float32)\n"
        "ix = retrieval.VectorIndex(4, 't@0'); ix.build([('a', v[0]), ('b', v[1])], 1)\n"
        "print(ix.search(v[1], k=1)[0].artifact_id, torch.__version__ != '')\n"
    )
    root = Path(__file__).resolve().parent.parent
    result = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "b True"
