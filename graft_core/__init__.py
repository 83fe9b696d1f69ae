"""kvgraft's engine: model loading, the artifact format, capture, graft, generation, exactness checks.

It computes on token ids and tensors it is handed; it opens no files but the model's own folder and
knows nothing about SQL, embeddings or HTTP. Importing the package loads nothing heavy: the names
below resolve lazily, so `import graft_core.errors` (or `db`, `retrieval`) never pulls in torch.
"""

from importlib import import_module

_LAZY = {
    "FORMAT": "artifact",
    "KVArtifact": "artifact",
    "artifact_key": "artifact",
    "dumps": "codec",
    "loads": "codec",
    "ArtifactNotFound": "errors",
    "IncompatibleArtifact": "errors",
    "InputTooLong": "errors",
    "IntegrityError": "errors",
    "InvalidInput": "errors",
    "KvgraftError": "errors",
    "VerificationFailed": "errors",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'graft_core' has no attribute {name!r}")
    return getattr(import_module(f".{_LAZY[name]}", __name__), name)
