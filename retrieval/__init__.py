"""Retrieval: a query's text -> a unit vector -> the ids of the artifacts whose vectors are nearest.

It owns the embedder and the persisted FAISS index; it knows nothing about how KV state is made.

faiss is imported here first, before anything below can pull in torch: importing faiss after torch
segfaulted on macOS (faiss#3401). Entry points that need both should import `retrieval` (or faiss)
before torch; on Linux either order works, and tests/test_retrieval.py checks torch-then-retrieval.
The index, the relevance stage and the embedder interface load no torch (errors come from the dependency-free
`errors.py`). The one module that computes with torch is `retrieval/encoder.py`, the real embedder's forward on
kvgraft's kernels; it and sentence-transformers are imported lazily, at the real embedder's first use.
"""

import faiss  # noqa: F401  (must come first; see above)

from retrieval.embedder import Embedder, HashEmbedder, SentenceEmbedder
from retrieval.index import DEFAULT_THRESHOLD, Hit, VectorIndex

__all__ = ["DEFAULT_THRESHOLD", "Embedder", "HashEmbedder", "Hit", "SentenceEmbedder", "VectorIndex"]
