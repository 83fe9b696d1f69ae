"""Concurrent answers' prompts and decode steps, taken together in `graft_core.batch.Batcher` passes under one
model lock (`StepGroup`). It knows the Batcher's passes only through `Batcher.run`, and nothing of the model."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import torch

from .batch import Batcher, Session


class StepGroup:
    """Concurrent answers' prompts and decode steps, taken together in `Batcher` passes under one model lock.

    `lock` is the model's lock (re-entrant; a caller may already hold it): the group waits on a
    condition over it, so an answer waiting for its prompt or step lets other model work run (the others'
    restores and proofs), and a round runs while holding it. Each answer's rows are those of its own
    `forward_chunk` calls (`Batcher`)."""

    def __init__(self, batcher: Batcher, lock=None, wait_s: float = 0.05):
        self.batcher = batcher
        self.cond = threading.Condition(lock if lock is not None else threading.RLock())
        self.wait_s = wait_s
        self.active = 0  # sessions inside their decode loop
        self.chats = 0  # of them, answers to a person (not in `background`)
        self._background: set[int] = set()  # threads doing background work (solve attempts)
        self.coming: set[int] = set()  # threads of answers on their way to a decode loop (prefill first)
        self._coming_lock = threading.Lock()  # not the model lock: a coming answer is about to wait for that
        self.pending: list[list] = []  # [a Session step or a (cache, ids, start) prompt, row, error] waiting for a round
        self.passes = 0  # decode rounds and the steps they took
        self.steps = 0

    @contextmanager
    def arriving(self):
        """Around an answer's wait for the model lock and its prefill: passes wait for it to join."""
        me = threading.get_ident()
        with self._coming_lock:
            self.coming.add(me)
        try:
            yield
        finally:
            with self._coming_lock:
                never_joined = me in self.coming  # failed (or was refused) before its decode loop
                self.coming.discard(me)
            if never_joined:  # passes waiting for it go on now rather than at their bound
                with self.cond:
                    self.cond.notify_all()

    @contextmanager
    def session(self):
        """Register a decode loop for its duration; yields the step function to call."""
        me = threading.get_ident()
        with self.cond:
            with self._coming_lock:
                self.coming.discard(me)
                chat = me not in self._background
                self.active += 1
                self.chats += chat
        try:
            yield self.step
        finally:
            with self.cond:
                with self._coming_lock:
                    self.active -= 1
                    self.chats -= chat
                self.cond.notify_all()

    @contextmanager
    def background(self):
        """Around this thread's work that is not an answer to a person (a solve attempt): its prompt and steps
        still go in the shared passes, but it does not hold other background work back past its bound
        (`after_answers`), as an answer does."""
        me = threading.get_ident()
        with self._coming_lock:
            self._background.add(me)
        try:
            yield
        finally:
            with self._coming_lock:
                self._background.discard(me)

    def busy(self, answers_only: bool = False) -> bool:
        """Sessions are decoding, waiting for a round, or on their way to one (restoring, prefilling); with
        `answers_only`, answers to a person, not background sessions (`background`)."""
        with self._coming_lock:
            if answers_only:
                return bool(self.chats or (self.coming - self._background))
            return bool(self.active or self.pending or self.coming)

    @contextmanager
    def after_answers(self, most_s: float, answers_s: float | None = None):
        """Hold the model lock for one unit of other work (an exactness-report sample) once no session is decoding,
        waiting or coming, or after `most_s` seconds of waiting once no answer to a person is (background
        sessions such as solve attempts may keep decoding then); past `answers_s` (default 4 x `most_s`) it
        goes anyway, so the other work always advances. Yields the seconds waited."""
        with self.cond:
            yield self.yield_to_answers(most_s, answers_s)

    def yield_to_answers(self, most_s: float, answers_s: float | None = None) -> float:
        """Holding the model lock (inside `after_answers`) between two parts of other work: let the sessions
        that arrived meanwhile go first, releasing the lock as `after_answers` says. Returns the seconds waited."""
        answers_s = 4 * most_s if answers_s is None else answers_s
        t0 = time.monotonic()
        with self.cond:  # re-entrant: the caller's hold, released whole while waiting
            while True:
                waited = time.monotonic() - t0
                if not self.busy(answers_only=waited >= most_s) or waited >= answers_s:
                    break
                self.cond.wait(min(answers_s - waited, self.wait_s))
        return time.monotonic() - t0

    def step(self, cache, token: int, pos: int) -> torch.Tensor:
        """The logits row of `token` at `pos` on `cache` (mutated), computed with the other waiting sessions' steps."""
        return self._submit(Session(cache, token, pos))

    def prefill(self, cache, ids: list[int], start: int) -> torch.Tensor:
        """The last logits row of prompt `ids` at `start` on `cache` (mutated), computed with the other waiting
        answers' prompts where their lengths allow (`Batcher.prefill`); the row `forward_chunk` gives alone."""
        return self._submit((cache, list(ids), start))

    def _submit(self, item) -> torch.Tensor:
        req = [item, None, None]  # (a Session step or a (cache, ids, start) prompt, row, error)
        with self.cond:
            self.pending.append(req)
            self.cond.notify_all()
            deadline = time.monotonic() + self.wait_s
            while req[1] is None and req[2] is None:
                with self._coming_lock:
                    expected = self.active + len(self.coming)
                everyone = len(self.pending) >= min(max(expected, 1), self.batcher.most)
                if self.pending and (everyone or time.monotonic() >= deadline):
                    self._run()
                    self.cond.notify_all()
                    deadline = time.monotonic() + self.wait_s
                else:
                    self.cond.wait(max(0.001, deadline - time.monotonic()))
            if req[2] is not None:
                raise req[2]
            return req[1]

    def _run(self) -> None:
        """One round, under the model lock: up to `most` waiting prompts and up to `most` waiting steps,
        together in as few passes as `Batcher.run` can take them."""
        prompts = [r for r in self.pending if not isinstance(r[0], Session)][: self.batcher.most]
        steps = [r for r in self.pending if isinstance(r[0], Session)][: self.batcher.most]
        taken = prompts + steps
        self.pending = [r for r in self.pending if all(r is not t for t in taken)]
        try:
            prompt_rows, step_rows = self.batcher.run([r[0] for r in prompts], [r[0] for r in steps])
        except BaseException as e:  # every taken request fails with the pass, none waits forever
            for r in taken:
                r[2] = e
            return
        for r, row in zip(taken, prompt_rows + step_rows, strict=True):
            r[1] = row
        if steps:
            self.passes += 1
            self.steps += len(steps)
