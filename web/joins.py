"""The page's queue counted at join: `install` hooks an `access.admission.Admission` into one Gradio queue, the
join route's `push` (reserve a place, then bind it to the event id) and the queue's table of live events, which an
event leaves when it finishes, fails, is cancelled or loses its client: then its place is released, exactly once.
A refused join is answered in Gradio's validation shape, which both gradio_client and the page show.
"""

from __future__ import annotations

from collections.abc import Callable

from access.admission import Admission
from access.guard import Client, Refused


class _Releasing(dict):
    """Gradio's table of live events (event id -> event): an id that leaves it frees its place."""

    def __init__(self, items: dict, release: Callable[[object], None]):
        super().__init__(items)
        self._release = release

    def pop(self, key, *default):
        try:
            return super().pop(key, *default)
        finally:
            self._release(key)

    def __delitem__(self, key):
        super().__delitem__(key)
        self._release(key)

    def popitem(self):
        key, value = super().popitem()
        self._release(key)
        return key, value

    def clear(self):
        for key in list(self):
            self.pop(key, None)


def refusal(message: str) -> list[dict]:
    """The join route's answer to a refused request: Gradio's validation shape (HTTP 422), whose message
    both gradio_client (`ValidationError`) and the page show."""
    return [{"__type__": "validate", "is_valid": False, "message": message, "parameter_name": "request"}]


# Gradio tells a client its result before it drops the event from its table (which frees the place), so a
# client that asks again the moment it is answered can join while its finished request still counts. A refused
# join is tried again for this long before it is answered; a request still running after it is refused as before.
SETTLE_S = 1.0


async def _reserve(admission: Admission, client: Client) -> int:
    """`admission.reserve(client)`, retried for SETTLE_S while the refusal may be a finished request not yet dropped."""
    import asyncio
    import time

    deadline = time.monotonic() + SETTLE_S
    while True:
        try:
            return admission.reserve(client)
        except Refused:
            if time.monotonic() >= deadline:
                raise
        await asyncio.sleep(0.01)


def install(queue, admission: Admission, client_of: Callable[[object], Client], counted: Callable[[object], bool]) -> None:
    """Count `counted` functions' requests of `queue` (a Blocks' `_queue`, after `Blocks.queue()`) at join.

    `client_of` maps a Gradio request (address, headers, session hash) to its `Client`, as the handlers do."""
    import gradio as gr

    original = queue.push
    queue.event_ids_to_events = _Releasing(queue.event_ids_to_events, admission.release)

    async def push(body, request, username):
        fn = queue.blocks.fns.get(body.fn_index) if body.fn_index is not None else None
        if fn is None or not counted(fn):
            return await original(body=body, request=request, username=username)
        try:
            ticket = await _reserve(admission, client_of(gr.Request(request=request, session_hash=body.session_hash)))
        except Refused as exc:
            return False, refusal(str(exc)), "validator_error"
        try:
            ok, event_id, state = await original(body=body, request=request, username=username)
        except BaseException:
            admission.release(ticket)
            raise
        if not ok:
            admission.release(ticket)
            return ok, event_id, state
        admission.bind(ticket, event_id)
        if event_id not in queue.event_ids_to_events:  # it ended already (e.g. served from a cache)
            admission.release(event_id)
        return ok, event_id, state

    queue.push = push
