"""Nearest-neighbour search over (artifact id, unit vector) pairs. Knows nothing about text, SQL or KV state.

The index is a cache of the catalog: it can always be rebuilt from the catalog's stored embeddings,
and `is_stale(catalog_version, embedder_id)` says when it must be. Scores are cosine similarities
(inner products of L2-normalised vectors; every vector is normalised on the way in).

Two structures, chosen by size:
- up to HNSW_THRESHOLD (20,000) vectors, FAISS `IndexFlatIP`: exact.
- above it, `IndexHNSWFlat` (M=32, inner product): approximate, exact scores on its candidates.
Measured on 2 cores, 384-d random unit vectors, one query, k=5, one OpenMP thread: flat 1.1 ms at
20,000 and 5.8 ms p50 / 6.6 ms p99 at 100,000; HNSW at 100,000 with efSearch 256: 1.3 / 1.5 ms
(efSearch 128: 0.64 / 0.82 ms). Random 384-d data is HNSW's worst case (no clusters); there, with
efConstruction 40 (a 13-22 s build on 2 threads; 80 took 39-49 s), top-1 agreement with exact search for a
query at cosine ~0.72 to its stored vector was 0.39 / 0.79 / 0.92 / 0.99 at efSearch 16 / 64 / 128 /
256. Hence efSearch 256: the 5 ms p99 budget affords it. `bench/retrieval.py` re-measures all this.

Removal: flat removes the row; HNSW cannot, so the row becomes a tombstone, excluded from searches by
an ID selector, until the next `build`.

Thresholds: DEFAULT_THRESHOLD = 0.45, measured with the packaged all-MiniLM-L6-v2 on the 20
question/paraphrase pairs and 5 off-topic questions in tests/test_retrieval.py:
- question vs its paraphrase: min 0.562, median 0.892, max 0.962 (must retrieve);
- question vs the other 19 items' paraphrases (380 pairs): max 0.346, median 0.072;
- off-topic questions vs the 20 items: max 0.189.
0.45 sits ~0.1 from either side. Not separated by any threshold: near misses on the same subject
("freezing point of water" vs a "boiling point of water" item: 0.781; "17 x 24" vs "17 x 23": 0.675)
score like paraphrases. Retrieval proposes candidates; it cannot tell a near miss from a match.

Persistence: `save(dir)` writes `index.faiss` (FAISS's own serialisation) and `index.json` (format,
ids, embedder id, catalog version, dim, count, SHA-256 of index.faiss), each atomically. `load(dir)`
re-hashes index.faiss against index.json and raises IntegrityError on any mismatch, missing file
or malformed field: the caller rebuilds from the catalog. No pickle anywhere.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np

from errors import IntegrityError, InvalidInput
from files import write_atomic

DEFAULT_THRESHOLD = 0.45
HNSW_THRESHOLD = 20_000
HNSW_M = 32
HNSW_EF_CONSTRUCTION = 40
HNSW_EF_SEARCH = 256

FORMAT = "kvgraft-index/1"
FAISS_FILE = "index.faiss"
META_FILE = "index.json"

Version = int | str


class HalfSaved(IntegrityError):
    """index.faiss and index.json are not the two files of one save: what a process killed between the two
    writes of `save` leaves (or a changed index.faiss). A cache's state, rebuilt on first use."""


@dataclass(frozen=True)
class Hit:
    artifact_id: str
    score: float  # cosine similarity, in [-1, 1]
    rank: int  # 1 is the best hit


@contextlib.contextmanager
def _omp_threads(n: int) -> Iterator[None]:
    """One query on 2 cores: flat search took 9 ms with one OpenMP thread, 34-45 ms with two."""
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(n)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)


def _new_faiss(dim: int, count: int, hnsw_threshold: int) -> faiss.Index:
    if count <= hnsw_threshold:
        return faiss.IndexFlatIP(dim)
    index = faiss.IndexHNSWFlat(dim, HNSW_M, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
    index.hnsw.efSearch = HNSW_EF_SEARCH
    return index


class VectorIndex:
    """(artifact id, vector) pairs for one embedder. All methods are thread-safe (one lock; a search
    holds it for about a millisecond)."""

    def __init__(self, dim: int, embedder_id: str, *, hnsw_threshold: int = HNSW_THRESHOLD):
        if dim < 1:
            raise InvalidInput(f"dim must be >= 1, got {dim}")
        self._dim = dim
        self._embedder_id = embedder_id
        self._hnsw_threshold = hnsw_threshold
        self._version: Version | None = None
        self._lock = threading.RLock()
        self._save_lock = threading.Lock()  # one save at a time, so the two files always belong together
        self._reset(_new_faiss(dim, 0, hnsw_threshold), [])

    def _reset(self, index: faiss.Index, ids: list[str | None]) -> None:
        self._faiss = index
        self._ids = ids  # FAISS row -> artifact id; None marks an HNSW tombstone
        self._rows = {artifact_id: row for row, artifact_id in enumerate(ids) if artifact_id is not None}
        self._refresh_selector()

    def _refresh_selector(self) -> None:
        dead = len(self._ids) - len(self._rows)
        if dead == 0:
            self._alive_bits = self._selector = None
            return
        alive = np.fromiter((artifact_id is not None for artifact_id in self._ids), dtype=bool, count=len(self._ids))
        self._alive_bits = np.packbits(alive, bitorder="little")  # kept alive: the selector points into it
        self._selector = faiss.IDSelectorBitmap(self._alive_bits)

    # -- properties ------------------------------------------------------------------------------

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def embedder_id(self) -> str:
        return self._embedder_id

    @property
    def version(self) -> Version | None:
        """The catalog version this index reflects (set by build, add/remove with version=, load)."""
        return self._version

    @property
    def kind(self) -> str:
        return "hnsw" if isinstance(self._faiss, faiss.IndexHNSWFlat) else "flat"

    def __len__(self) -> int:
        return len(self._rows)

    def __contains__(self, artifact_id: object) -> bool:
        return artifact_id in self._rows

    def mark_version(self, version: Version) -> None:
        """Record the catalog version this index now reflects (after an incremental sync)."""
        with self._lock:
            self._version = version

    def ids(self) -> frozenset[str]:
        """The artifact ids currently searchable."""
        with self._lock:
            return frozenset(self._rows)

    def is_stale(self, catalog_version: Version, embedder_id: str) -> bool:
        """True when this index was built for another catalog version or another embedder: rebuild it."""
        return self._version != catalog_version or self._embedder_id != embedder_id

    # -- vectors ---------------------------------------------------------------------------------

    def _unit_rows(self, vectors: np.ndarray, what: str) -> np.ndarray:
        matrix = np.asarray(vectors, dtype=np.float32)
        if matrix.ndim != 2 or matrix.shape[1] != self._dim:
            raise InvalidInput(f"{what} must have shape [{self._dim}] for this index, got {list(np.shape(vectors))}")
        if not np.isfinite(matrix).all():
            raise InvalidInput(f"{what} contains NaN or infinity")
        norms = np.linalg.norm(matrix, axis=1, keepdims=True)
        if (norms == 0).any():
            raise InvalidInput(f"{what} contains an all-zero vector, which has no direction")
        return np.ascontiguousarray(matrix / norms)

    def _unit(self, vector: np.ndarray, what: str) -> np.ndarray:
        v = np.asarray(vector)
        if v.shape != (self._dim,):
            raise InvalidInput(f"{what} must have shape [{self._dim}] for this index, got {list(v.shape)}")
        return self._unit_rows(v[None, :], what)

    # -- mutation --------------------------------------------------------------------------------

    def build(self, pairs: Iterable[tuple[str, np.ndarray]], version: Version) -> None:
        """Replace the whole content with `pairs` and record `version`. Searches see the old content
        until the new one is complete. Uses every OpenMP thread (HNSW at 100,000: 13 s on 2 idle cores)."""
        ids: list[str | None] = []
        vectors: list[np.ndarray] = []
        seen: set[str] = set()
        for artifact_id, vector in pairs:
            if not isinstance(artifact_id, str) or not artifact_id:
                raise InvalidInput(f"artifact ids must be non-empty str, got {artifact_id!r}")
            if artifact_id in seen:
                raise InvalidInput(f"artifact id {artifact_id!r} appears twice in build(); ids must be unique")
            seen.add(artifact_id)
            ids.append(artifact_id)
            vector = np.asarray(vector)
            if vector.shape != (self._dim,):
                raise InvalidInput(f"the vector for {artifact_id!r} must have shape [{self._dim}], got {list(vector.shape)}")
            vectors.append(vector)
        matrix = self._unit_rows(np.stack(vectors), "build vectors") if vectors else np.zeros((0, self._dim), np.float32)
        index = _new_faiss(self._dim, len(ids), self._hnsw_threshold)
        index.add(matrix)
        with self._lock:
            self._reset(index, ids)
            self._version = version

    def add(self, artifact_id: str, vector: np.ndarray, *, version: Version | None = None) -> None:
        """Add one pair; an id already present is replaced. Crossing HNSW_THRESHOLD rebuilds as HNSW
        once (seconds). `version`, when given, becomes the recorded catalog version."""
        if not isinstance(artifact_id, str) or not artifact_id:
            raise InvalidInput(f"artifact ids must be non-empty str, got {artifact_id!r}")
        row_vector = self._unit(vector, "vector")
        with self._lock:
            self._remove_locked(artifact_id)
            if self.kind == "flat" and len(self._ids) + 1 > self._hnsw_threshold:
                live = [row for row, a in enumerate(self._ids) if a is not None]
                pairs = [(self._ids[row], self._faiss.reconstruct(row)) for row in live]
                self.build([*pairs, (artifact_id, row_vector[0])], self._version)
            else:
                self._faiss.add(row_vector)
                self._ids.append(artifact_id)
                self._rows[artifact_id] = len(self._ids) - 1
                if self._selector is not None:
                    self._refresh_selector()  # the bitmap must cover the new row
            if version is not None:
                self._version = version

    def remove(self, artifact_id: str, *, version: Version | None = None) -> bool:
        """Remove one id; returns whether it was present. `version`, when given, is recorded."""
        with self._lock:
            present = self._remove_locked(artifact_id)
            if version is not None:
                self._version = version
            return present

    def _remove_locked(self, artifact_id: str) -> bool:
        row = self._rows.pop(artifact_id, None)
        if row is None:
            return False
        if self.kind == "flat":
            self._faiss.remove_ids(np.array([row], dtype=np.int64))  # later rows shift down by one
            del self._ids[row]
            self._rows = {a: r for r, a in enumerate(self._ids)}
        else:
            self._ids[row] = None
            self._refresh_selector()
        return True

    # -- search ----------------------------------------------------------------------------------

    def search(
        self, vector: np.ndarray, k: int = 5, threshold: float = DEFAULT_THRESHOLD, allowed: frozenset[str] | None = None
    ) -> list[Hit]:
        """The best `k` hits by cosine, best first, keeping only those with score >= threshold; with `allowed`,
        only among those artifact ids (one model's artifacts in a store holding several: the others are never
        candidates, so they neither appear nor take a place among the `k`)."""
        if k < 1:
            raise InvalidInput(f"k must be >= 1, got {k}")
        query = self._unit(vector, "query vector")
        with self._lock:
            selector, keep = self._selector, self._alive_bits
            if allowed is not None:
                ok = np.fromiter((i is not None and i in allowed for i in self._ids), dtype=bool, count=len(self._ids))
                count = int(ok.sum())
                keep = np.packbits(ok, bitorder="little")  # held for the search: the selector points into it
                selector = faiss.IDSelectorBitmap(keep) if count < len(self._ids) else None
            else:
                count = len(self._rows)
            k = min(k, count)
            if k == 0:
                return []
            with _omp_threads(1):
                if self.kind == "hnsw":
                    params = faiss.SearchParametersHNSW()
                    params.efSearch = max(HNSW_EF_SEARCH, k)
                    if selector is not None:
                        params.sel = selector
                    scores, rows = self._faiss.search(query, k, params=params)
                elif selector is not None:
                    params = faiss.SearchParameters()
                    params.sel = selector
                    scores, rows = self._faiss.search(query, k, params=params)
                else:
                    scores, rows = self._faiss.search(query, k)
            hits: list[Hit] = []
            for score, row in zip(scores[0].tolist(), rows[0].tolist(), strict=True):
                if row < 0 or score < threshold:
                    break  # results are sorted best first; -1 pads when fewer than k were found
                artifact_id = self._ids[row]
                assert artifact_id is not None, "the selector excludes tombstoned rows"
                assert allowed is None or artifact_id in allowed, "the selector excludes ids not allowed"
                hits.append(Hit(artifact_id, float(score), len(hits) + 1))
            return hits

    # -- persistence -----------------------------------------------------------------------------

    def save(self, directory: str | os.PathLike) -> None:
        """Write `index.faiss` then `index.json` into `directory`, each atomically. A crash between the
        two leaves a JSON whose hash no longer matches, which `load` reports as IntegrityError; a write
        error in either (a full disk) removes both, so the index reads as missing, never as half a pair."""
        folder = Path(directory)
        folder.mkdir(parents=True, exist_ok=True)
        with self._save_lock:
            with self._lock:  # a consistent snapshot; searches wait only for the copy, not the disk
                data = faiss.serialize_index(self._faiss).tobytes()
                meta = {
                    "format": FORMAT,
                    "kind": self.kind,
                    "embedder_id": self._embedder_id,
                    "catalog_version": self._version,
                    "dim": self._dim,
                    "count": len(self._rows),
                    "hnsw_threshold": self._hnsw_threshold,
                    "faiss_sha256": hashlib.sha256(data).hexdigest(),
                    "ids": list(self._ids),
                }
            try:
                write_atomic(folder / FAISS_FILE, data)
                write_atomic(folder / META_FILE, json.dumps(meta, indent=1).encode("utf-8"))
            except BaseException:
                for name in (META_FILE, FAISS_FILE):
                    with contextlib.suppress(OSError):
                        (folder / name).unlink()
                raise

    @classmethod
    def load(cls, directory: str | os.PathLike) -> VectorIndex:
        """Read what `save` wrote. Any missing, corrupt or inconsistent file raises IntegrityError."""
        folder = Path(directory)
        meta_path, faiss_path = folder / META_FILE, folder / FAISS_FILE
        rebuild = "rebuild the index from the catalog (VectorIndex.build) and save it again"
        try:
            meta = json.loads(meta_path.read_bytes())
        except FileNotFoundError:
            raise IntegrityError(f"no vector index at {folder}: {META_FILE} is missing; {rebuild}") from None
        except (OSError, ValueError) as e:
            raise IntegrityError(f"{meta_path} is not readable JSON ({e}); {rebuild}") from None
        try:
            data = faiss_path.read_bytes()
        except OSError:
            raise IntegrityError(f"{faiss_path} is missing or unreadable; {rebuild}") from None

        def bad(field: str) -> IntegrityError:
            return IntegrityError(f"{meta_path} has a missing or malformed {field!r}; {rebuild}")

        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise bad("format")
        if hashlib.sha256(data).hexdigest() != meta.get("faiss_sha256"):
            raise HalfSaved(
                f"{faiss_path} does not match the SHA-256 recorded in {META_FILE} (corrupt or half-written); {rebuild}"
            )
        dim, ids, version = meta.get("dim"), meta.get("ids"), meta.get("catalog_version")
        if type(dim) is not int or dim < 1:
            raise bad("dim")
        if not isinstance(ids, list) or not all(a is None or (isinstance(a, str) and a) for a in ids):
            raise bad("ids")
        live = [a for a in ids if a is not None]
        if len(set(live)) != len(live) or meta.get("count") != len(live):
            raise bad("count")
        if not isinstance(meta.get("embedder_id"), str):
            raise bad("embedder_id")
        if version is not None and type(version) not in (int, str):
            raise bad("catalog_version")
        threshold = meta.get("hnsw_threshold")
        if type(threshold) is not int:
            raise bad("hnsw_threshold")
        try:
            index = faiss.deserialize_index(np.frombuffer(data, dtype=np.uint8))
        except RuntimeError as e:
            raise IntegrityError(f"{faiss_path} is not a FAISS index ({str(e).splitlines()[0]}); {rebuild}") from None
        expected = faiss.IndexHNSWFlat if meta.get("kind") == "hnsw" else faiss.IndexFlatIP
        if (
            type(index) is not expected
            or index.d != dim
            or index.ntotal != len(ids)
            or index.metric_type != faiss.METRIC_INNER_PRODUCT
        ):
            raise IntegrityError(f"{faiss_path} does not hold the {meta.get('kind')} index {META_FILE} describes; {rebuild}")
        if isinstance(index, faiss.IndexFlatIP) and len(live) != len(ids):
            raise bad("ids")
        out = cls(dim, meta["embedder_id"], hnsw_threshold=threshold)
        out._reset(index, ids)
        out._version = version
        return out
