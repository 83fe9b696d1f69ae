"""`ModelTurns`: who computes on this process's model when. It holds the store's model lock and, once a
serving process asks for it, the `graft_core.stepgroup.StepGroup` through which concurrent answers decode
together; every pipeline that runs the model takes its turn here. It knows nothing about what a turn computes.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the engine (torch) loads with the first turn that needs it, not with the web page
    from graft_core.model import LoadedModel
    from graft_core.stepgroup import StepGroup

log = logging.getLogger("kvgraft.answer")


class ModelTurns:
    """The model lock of one store and the decode group of one model (module doc).

    `answers_first_s` bounds how long other work waits for decoding answers; `decode_together()` is read when
    the group is built (KVGRAFT_DECODE_TOGETHER, services.limits)."""

    def __init__(
        self,
        lock: threading.RLock,
        lm: Callable[[], LoadedModel],
        answers_first_s: float,
        decode_together: Callable[[], int],
    ):
        self.lock = lock
        self._lm = lm
        self._answers_first_s = answers_first_s
        self._decode_together = decode_together
        self._steps: StepGroup | bool | None = None  # None: not built yet; False: none applies here

    def decode_group(self) -> StepGroup | None:
        """The StepGroup answers decode through once `start_decoding_together` built it; None before, with
        KVGRAFT_DECODE_TOGETHER=1, or where no padded width gives the 1-row bytes (then every answer decodes
        alone). A one-answer process (`cli.py ask`) never builds it."""
        return self._steps or None

    def start_decoding_together(self) -> str:
        """Build the StepGroup concurrent answers decode through (~1 s: every width is checked per weight
        shape), under the model lock; idempotent. Returns a log line."""
        from graft_core.batch import Batcher
        from graft_core.stepgroup import StepGroup

        with self.lock:
            if self._steps is None:
                if self._decode_together() <= 1:
                    self._steps, line = False, "answers decode one at a time (KVGRAFT_DECODE_TOGETHER=1)"
                else:
                    batcher = Batcher(self._lm().model)
                    self._steps = StepGroup(batcher, lock=self.lock) if batcher.widths else False
                    line = f"answers decode {batcher.describe()}"
                log.info("%s", line)
                return line
            return "answers decode together" if self._steps else "answers decode one at a time"

    @contextlib.contextmanager
    def answering(self) -> Iterator[StepGroup | None]:
        """The turn of one answer: announced to the decode group (so other work lets it go first), then the
        model lock. Yields the decode group to decode through (None: decode alone)."""
        steps = self.decode_group()
        with steps.arriving() if steps is not None else contextlib.nullcontext(), self.lock:
            yield steps

    @contextlib.contextmanager
    def background(self) -> Iterator[StepGroup | None]:
        """The turn of work that decodes as an answer does (a solve's attempt: its prompt and steps go in the
        answers' shared passes, the same tokens as alone) but is background work, so it holds no
        exactness-report sample back. Yields the decode group (None: decode alone)."""
        steps = self.decode_group()
        if steps is None:
            with self.lock:
                yield None
        else:
            with steps.background(), steps.arriving(), self.lock:
                yield steps

    @contextlib.contextmanager
    def after_answers(self) -> Iterator[Callable[[], None]]:
        """The model lock for one unit of work that is not an answer (an exactness-report sample): where answers
        decode together, taken once none is decoding or coming, or after `answers_first_s`, so a chat never
        waits behind a queue of other work, and that work still runs at least once per bound. Yields what to
        call between two parts of the work, to let answers that arrived meanwhile go first again."""
        steps = self.decode_group()
        if steps is None:
            with self.lock:
                yield lambda: None
        else:
            with steps.after_answers(self._answers_first_s):
                yield lambda: steps.yield_to_answers(self._answers_first_s)
