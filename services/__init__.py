"""The pipelines: deposit, answer, the exactness report, solve, and the views of the store. The only package
that wires the engine (`graft_core`), the catalog and blobs (`db`) and retrieval (`retrieval`) together.

Front ends (`cli/`, `web/`) call one member of a `LibraryDoor` (or one upkeep function below) and format its
result with `to_json()` or the result's typed fields. Modules: `door` (what front ends call: `LibraryDoor`
with each member's contract, which `Library` implements, and `AnswerOptions`), `store` (one store: catalog,
blobs, index, model lock), `library` (a store and the model, composed of: `artifacts`, reads and first-use
proofs; `turns`, who computes on the model when; the pipelines `deposit`, `answer`, `exactness_report`, `solve`, each
handed what it needs), `gate` (the deposit check), `vetting` (what an import re-checks), the upkeep of a
store, on `library.store` (`exchange`: export/import bundles, `rebuild`: rebuild-and-compare, `integrity`: fsck,
`replay`: the answer ledger re-run), `results` (what the door returns), `limits` (input bounds).

Importing it loads neither the engine (torch, transformers) nor retrieval (faiss, the embedder): each
pipeline imports them where it first needs them, so the web app serves its page before they load (its
start-up stages load them). Entry points that use both import `retrieval` first (faiss before torch:
see retrieval/__init__.py).
"""

from .door import DEFAULT_ANSWER, AnswerOptions, LibraryDoor
from .exchange import BUNDLE_FORMAT, ExportReport, ImportReport, export_bundle, import_bundle
from .integrity import ORPHAN_GRACE_S, BlobProblem, FsckReport, IndexStatus, Repaired, fsck
from .library import Library, default_home
from .limits import MAX_K, MAX_QUESTION_CHARS, MAX_TEXT_CHARS
from .rebuild import RebuildReport, rebuild_compare
from .replay import ReplayEntry, ReplayReport, replay_ledger
from .results import (
    AnswerResult,
    DeleteReport,
    Deposited,
    ExactnessReport,
    ExactnessSample,
    Flywheel,
    LibraryEntry,
    Retrieved,
    ShowReport,
    Solved,
    StoreStats,
    WarmReport,
)

__all__ = [
    "MAX_K",
    "MAX_QUESTION_CHARS",
    "MAX_TEXT_CHARS",
    "DEFAULT_ANSWER",
    "AnswerOptions",
    "AnswerResult",
    "DeleteReport",
    "Deposited",
    "Flywheel",
    "Library",
    "LibraryDoor",
    "LibraryEntry",
    "Retrieved",
    "ShowReport",
    "Solved",
    "StoreStats",
    "ExactnessReport",
    "ExactnessSample",
    "WarmReport",
    "default_home",
    "BUNDLE_FORMAT",
    "ORPHAN_GRACE_S",
    "BlobProblem",
    "ExportReport",
    "FsckReport",
    "ImportReport",
    "IndexStatus",
    "RebuildReport",
    "ReplayEntry",
    "Repaired",
    "ReplayReport",
    "export_bundle",
    "fsck",
    "import_bundle",
    "rebuild_compare",
    "replay_ledger",
]
