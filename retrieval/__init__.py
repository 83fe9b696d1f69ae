"""Retrieval: a query's text -> a unit vector -> the ids of the artifacts whose vectors are nearest.

It owns the embedder and the persisted FAISS index; it knows nothing about how KV state is made.

faiss is imported here first, before anything below can pull in torch: importing faiss after torch
segfaulted on macOS (faiss#3401). Entry points that need both should import `retrieval` (or faiss)
before torch; on Linux either order works, and tests/test_retrieval.py checks torch-then-retrieval.
Nothing in `retrieval` imports torch itself (errors come from the dependency-free `errors.py`).
The real embedder imports sentence-transformers lazily, on first use.
"""

import faiss  # noqa: F401  (must come first; see above)

from retrieval.embedder import Embedder, HashEmbedder, SentenceEmbedder
from retrieval.index import DEFAULT_THRESHOLD, Hit, VectorIndex

__all__ = ["DEFAULT_THRESHOLD", "Embedder", "HashEmbedder", "Hit", "SentenceEmbedder", "VectorIndex"]
