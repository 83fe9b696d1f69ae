"""The pipelines: deposit, answer, verify, and the views of the store. The only package that wires the
engine (`graft_core`), the catalog and blobs (`db`) and retrieval (`retrieval`) together.

Front ends (cli.py, app.py) call one method of `Library` and format its result with `to_json()` or
the result's typed fields. Modules: `library` (the door), `deposit`, `answer`, `verify`, `index`
(the pipelines mixed into it), `exchange`, `checks`, `replay` (upkeep, named by `maintenance.py`),
`results` (what they return), `limits` (input bounds).

Importing it loads neither the engine (torch, transformers) nor retrieval (faiss, the embedder): each
pipeline imports them where it first needs them, so the web app serves its page before they load (its
start-up stages load them). Entry points that use both import `retrieval` first (faiss before torch:
see retrieval/__init__.py).
"""

from .library import DeleteReport, Library, WarmReport, default_home
from .limits import MAX_K, MAX_QUESTION_CHARS, MAX_TEXT_CHARS
from .results import (
    AnswerResult,
    Deposited,
    Flywheel,
    LibraryEntry,
    Retrieved,
    ShowReport,
    Solved,
    StoreStats,
    VerifyReport,
    VerifySample,
)

__all__ = [
    "MAX_K",
    "MAX_QUESTION_CHARS",
    "MAX_TEXT_CHARS",
    "AnswerResult",
    "DeleteReport",
    "Deposited",
    "Flywheel",
    "Library",
    "LibraryEntry",
    "Retrieved",
    "ShowReport",
    "Solved",
    "StoreStats",
    "VerifyReport",
    "VerifySample",
    "WarmReport",
    "default_home",
]
