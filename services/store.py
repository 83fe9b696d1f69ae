"""`Store`: one kvgraft store, the catalog (SQL), the blob store (disk), the FAISS index kept in step with
the catalog, and the lock under which this process's model computes for it. A `Library` holds one and hands
it to its pipelines; the upkeep functions (fsck, rebuild, export, import, replay, vetting) work on its
public members. It knows nothing about the model's numbers: it stores and finds bytes.

The index is a cache of the catalog: loaded from `<home>/index`, synced by difference when the catalog
moved on, rebuilt from the stored embeddings when missing, corrupt or made by another embedder. Both a
rebuild and a sync first embed, from its source, every artifact the live embedder has no vector for (a
store made under another embedder id, a deposit by a replica running another version), so a new embedder
finds what the old one did.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from db.blobs import BlobStore
from db.catalog import Catalog
from errors import KvgraftError, StorageError
from files import write_faults

log = logging.getLogger("kvgraft.index")

if TYPE_CHECKING:  # faiss loads with the first index (the web app's start-up stage), not with the page
    from retrieval import Embedder, VectorIndex


class Store:
    """The catalog, the blobs, the index and the model lock of one store (module doc).

    `catalog` owns every SQL statement, `blobs` every artifact file; `lock` is held by whatever runs the
    model for this store in this process (one request at a time); `index()` is the FAISS index, `embedder`
    the live embedder it is kept for (the Library's, loaded at first use)."""

    def __init__(self, home: Path, catalog: Catalog, blobs: BlobStore, embedder: Callable[[], Embedder]):
        self.home = home
        self.catalog = catalog
        self.blobs = blobs
        self.lock = threading.RLock()
        self._embedder = embedder
        self._index: VectorIndex | None = None
        self._index_lock = threading.Lock()
        self._model_ids: dict[str, tuple[int, frozenset[str] | None]] = {}  # fingerprint -> (catalog version, ids)

    @classmethod
    def open(cls, home: Path, db_url: str, blob_root: Path | None, embedder: Callable[[], Embedder]) -> Store:
        """The store at `home`: its catalog at `db_url`, its blobs under `blob_root` (default `<home>/blobs`;
        one root shared by replicas, serving/)."""
        return cls(home, Catalog.open(db_url, home), BlobStore(blob_root or home / "blobs"), embedder)

    @property
    def embedder(self) -> Embedder:
        return self._embedder()

    def model_ids(self, fingerprint: str) -> frozenset[str] | None:
        """The artifact ids retrieval may offer the model `fingerprint` (its own; never another model's), or None
        when every artifact in the store is its own. Read again whenever the catalog's version moved."""
        from db import models

        version = self.catalog.version()
        cached = self._model_ids.get(fingerprint)
        if cached is not None and cached[0] == version:
            return cached[1]
        ids = None if models.only(self.catalog, fingerprint) else models.artifact_ids(self.catalog, fingerprint)
        self._model_ids[fingerprint] = (version, ids)
        return ids

    def close(self) -> None:
        """Release the catalog's connections (the store is unusable afterwards)."""
        self.catalog.close()

    def discard_blobs(self, digests: list[str]) -> None:
        """Remove blobs a failed write made, unless a row refers to them (a concurrent deposit of the same bytes
        committed meanwhile). Where the catalog cannot even be asked, the blob stays: an orphan for fsck."""
        for digest in digests:
            with contextlib.suppress(KvgraftError, OSError):
                if self.catalog.content_refcount(digest) == 0:
                    self.blobs.delete(digest)

    def folder(self) -> Path:
        """The folder a disk error names: the store's home, or the blob folder where it lies elsewhere."""
        root = self.blobs.root
        return self.home if root.is_relative_to(self.home) else root

    def index(self) -> VectorIndex:
        """The FAISS index, loaded from disk or rebuilt from the catalog when missing or stale.

        One thread rebuilds at a time; the others wait and reuse its result."""
        from retrieval import VectorIndex

        with self._index_lock:
            version = self.catalog.version()
            idx = self._index
            if idx is not None and not idx.is_stale(version, self.embedder.embedder_id):
                return idx
            if idx is not None and idx.embedder_id == self.embedder.embedder_id:
                return self._sync(idx, version)
            try:
                idx = VectorIndex.load(self.home / "index")
            except (KvgraftError, OSError):
                idx = None
            if idx is None or idx.is_stale(version, self.embedder.embedder_id):
                return self._rebuild(version, must_save=False)
            self._index = idx
            return idx

    def rebuild_index(self) -> VectorIndex:
        """Rebuild the FAISS index from the catalog's embeddings and save it, whatever is on disk."""
        with self._index_lock:
            return self._rebuild(self.catalog.version(), must_save=True)

    def _sync(self, idx: VectorIndex, version: int) -> VectorIndex:
        """Bring a live index up to the catalog by adding and removing only what changed: a deposit
        made by another process costs one insert here, not a rebuild (HNSW builds take seconds). An artifact
        that process recorded under another embedder only (one not yet upgraded) is embedded here first."""
        version = self._caught_up(version, must_save=False)
        pairs = dict(self.catalog.embeddings(self.embedder.embedder_id))
        have = idx.ids()
        for gone in have - pairs.keys():
            idx.remove(gone)
        for aid in pairs.keys() - have:
            idx.add(aid, np.frombuffer(pairs[aid], dtype="<f4"))
        idx.mark_version(version)
        try:
            idx.save(self.home / "index")
        except OSError:
            pass
        return idx

    def _embed_missing(self) -> int:
        """Embed every artifact the live embedder has no vector for (question, else text: as a deposit does)
        and record them in one transaction; returns how many."""
        from graft_core.artifact import text_sha256

        eid = self.embedder.embedder_id
        made = []
        for aid, text in self.catalog.unembedded(eid):
            vec = np.asarray(self.embedder.embed(text), dtype="<f4")
            made.append((aid, (eid, vec.tobytes(), int(vec.shape[0]), text_sha256(text))))
        if made:
            log.info("embedding %d artifact(s) with no vector by %s", len(made), eid)
            self.catalog.add_embeddings(made)
        return len(made)

    def _caught_up(self, version: int, must_save: bool) -> int:
        """The catalog version once `_embed_missing` has run: `version` where nothing was missing, or where
        the store refused the write and `must_save` is False (a read-only store answers from what it has)."""
        try:
            return self.catalog.version() if self._embed_missing() else version
        except StorageError:
            if must_save:
                raise
            return version

    def _rebuild(self, version: int, must_save: bool) -> VectorIndex:
        from retrieval import VectorIndex

        version = self._caught_up(version, must_save)
        idx = VectorIndex(self.embedder.dim, self.embedder.embedder_id)
        pairs = [(aid, np.frombuffer(vec, dtype="<f4")) for aid, vec in self.catalog.embeddings(self.embedder.embedder_id)]
        idx.build(pairs, version)
        needed = 2 * len(pairs) * self.embedder.dim * 4 + (1 << 20)  # the vectors and their ids, with room
        try:
            with write_faults(
                self.home, "rebuild it again (`cli.py fsck --repair`)", needed, "answers rebuild it in memory meanwhile"
            ):
                idx.save(self.home / "index")
        except (OSError, StorageError):
            if must_save:
                raise  # a read-only store still answers from the in-memory index
        self._index = idx
        return idx
