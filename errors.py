"""The error hierarchy every layer raises. Messages say what happened and what to do next.

Dependency-free (no torch, SQL or HTTP), so every layer may import it; the CLI and the web app turn
these into one clear line and catch them by type.
"""


class KvgraftError(Exception):
    """Base of every error kvgraft raises on purpose."""


class IntegrityError(KvgraftError):
    """Stored bytes do not match the hash they were stored under (corruption or tampering)."""


class IncompatibleArtifact(KvgraftError):
    """An artifact was made by another model, dtype, configuration or format version."""


class ArtifactNotFound(KvgraftError):
    """No artifact with the given id exists in this store."""


class VerificationFailed(KvgraftError):
    """A verified item's answer did not pass its verifier; nothing was deposited."""


class InputTooLong(KvgraftError):
    """Input is larger than the bound that applies to it (context window, request size)."""


class InvalidInput(KvgraftError):
    """Input is malformed (empty, not text, wrong shape); the message says which field."""


class InvalidSetting(InvalidInput):
    """A KVGRAFT_* environment variable holds a value kvgraft cannot use; the message names it and what it must be."""


class NotReady(KvgraftError):
    """The app is still starting (model conversion or loading, seeding); the message says which stage and how long."""


def quarantine_message(artifact_id: str, reason: str) -> str:
    """What an IntegrityError says about a quarantined artifact, and the two commands that deal with it."""
    return (
        f"artifact {artifact_id} is quarantined ({reason}); it is never grafted. Run `cli.py rebuild --verify "
        f"{artifact_id}` to see what a recompute gives, or `cli.py delete {artifact_id}`"
    )
