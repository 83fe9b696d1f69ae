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
    """A verified item's answer did not pass its verifier; nothing was deposited. `gate_tokens`: the tokens the
    gate's runs computed before the refusal (0 where it refused before running the model)."""

    def __init__(self, message: str = "", gate_tokens: int = 0):
        super().__init__(message)
        self.gate_tokens = gate_tokens


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
        f"artifact {artifact_id} is quarantined ({reason}); it is never grafted. Run `cli.py rebuild --compare "
        f"{artifact_id}` to see what a recompute gives, or `cli.py delete {artifact_id}`"
    )


class StorageError(KvgraftError):
    """A write to the store's disk failed (no space, an I/O error, a read-only file system). Nothing partial is
    left visible; the message names the folder and what to do. `code` is the errno, `folder` the folder named."""

    def __init__(self, message: str, code: int = 0, folder: str = ""):
        super().__init__(message)
        self.code = code
        self.folder = folder


class StoreFull(StorageError):
    """No space left on the device (or the quota) holding the store: ENOSPC, EDQUOT."""


class CatalogUnavailable(KvgraftError):
    """The catalog database cannot be reached (its server is down or restarting); retrying later is safe."""


# The errno values a write can fail with that say something about the disk rather than about kvgraft.
WRITE_FAULTS = {28: "no space left on device", 122: "disk quota exceeded", 5: "input/output error", 30: "read-only file system"}


def storage_error(
    code: int,
    folder: object,
    action: str = "try again",
    needed_bytes: int = 0,
    outcome: str = "nothing was stored",
    elsewhere: str = "or move KVGRAFT_HOME to a larger disk",
) -> StorageError:
    """The one-line error for a write that failed with errno `code` in `folder`: what happened there, what to
    free or check, what to run next (`action`) and what the failure left (`outcome`)."""
    what = WRITE_FAULTS.get(code, f"errno {code}")
    if code in (28, 122):
        mb = max(1, -(-needed_bytes // (1 << 20)))
        return StoreFull(
            f"{what} in {folder}: free at least {mb} MB there ({elsewhere}), then {action}; {outcome}", code, str(folder)
        )
    if code == 30:
        elsewhere = elsewhere.replace("a larger disk", "a writable disk")
        return StorageError(
            f"{folder} is on a {what}: remount it read-write ({elsewhere}), then {action}; {outcome}", code, str(folder)
        )
    return StorageError(
        f"{what} writing to {folder}: its disk or file system is failing; check the device (dmesg, smartctl), "
        f"then {action}; {outcome}",
        code,
        str(folder),
    )
