"""kvgraft's engine: model loading, the artifact format, capture, graft, generation, exactness checks.

It computes on token ids and tensors it is handed; it opens no files but the model's own folder and
knows nothing about SQL, embeddings or HTTP.
"""

from .artifact import FORMAT, KVArtifact, artifact_key
from .codec import dumps, loads
from .errors import (
    ArtifactNotFound,
    IncompatibleArtifact,
    InputTooLong,
    IntegrityError,
    InvalidInput,
    KvgraftError,
    VerificationFailed,
)

__all__ = [
    "FORMAT",
    "ArtifactNotFound",
    "IncompatibleArtifact",
    "InputTooLong",
    "IntegrityError",
    "InvalidInput",
    "KVArtifact",
    "KvgraftError",
    "VerificationFailed",
    "artifact_key",
    "dumps",
    "loads",
]
