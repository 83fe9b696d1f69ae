"""A refusal is the caller's doing, not the app's: a wrong token, a value over a bound, a quota, input the
app cannot take. `Refusal` is the Gradio error every handler raises for one: the user sees its message,
the log gets one line (no traceback: ~3,000 refused guesses once wrote 6.8 MB of them). A real error
(any other exception) still reaches Gradio, which logs its traceback. What text is refused is the edge's
(`access.bodies.text_problem`), the same for the page and the API.
"""

from __future__ import annotations

import logging

import gradio as gr

from access.bodies import text_problem

log = logging.getLogger("kvgraft.refused")


class Refusal(gr.Error):
    """`gr.Error(message)` that logs one line and no traceback."""

    def __init__(self, message: str):
        super().__init__(message, print_exception=False)
        line = (message.splitlines() or [""])[0][:300]  # one line: a message cannot forge another log line
        log.info("refused: %s", line.encode("utf-8", "backslashreplace").decode("utf-8"))


def quiet_checks(demo: gr.Blocks) -> int:
    """Gradio's own checks of a value sent to one of `demo`'s components (a dropdown's choices, a number's
    bounds, a chat history's shape) raise gr.Error from the component's `preprocess`, which Gradio logs with
    its traceback: a value the caller sent, so one log line instead, as for a `Refusal`. The user still sees
    Gradio's message. Returns how many components' checks were wrapped."""
    wrapped = 0
    for block in demo.blocks.values():
        check = getattr(block, "preprocess", None)
        if check is None or getattr(check, "_kvgraft_quiet", False):
            continue

        def quiet(payload, _check=check):
            try:
                return _check(payload)
            except gr.Error as exc:
                exc.print_exception = False
                line = (str(exc).splitlines() or [""])[0][:300]
                log.info("refused: %s", line.encode("utf-8", "backslashreplace").decode("utf-8"))
                raise

        quiet._kvgraft_quiet = True
        block.preprocess = quiet
        wrapped += 1
    return wrapped


def require_text(*values: object) -> None:
    """Refuse (before any work) text that `text_problem` finds wrong."""
    problem = text_problem(*values)
    if problem:
        raise Refusal(problem)
