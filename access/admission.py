"""Who may join the model's queue: a model request is counted when it JOINS a queue (the page's Gradio queue,
or an API request's arrival), not when its handler runs, so one address with many sessions cannot push
everyone else back in the queue.

`Admission` keeps the model requests that joined and have not ended (waiting or running), per session and per
address; one over its session's share (one) or its address's depth is refused at join, before it takes a place
in the queue. The page hooks it into Gradio's queue (`web.joins`), the API reserves a place per request
(`serving.openai_api`). It knows nothing about the model, Gradio or HTTP; `access.guard.FairTurns` decides
who runs next among the joined.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter

from access.guard import Client, Refused

SESSION_REFUSAL = "One request at a time per session: wait for your previous request to finish."
ADDRESS_REFUSAL = (
    "Your address already has {depth} requests queued or running; wait for your earlier requests to finish, then send again."
)


class Admission:
    """The joined model requests, `per_session` per session and `depth` per address at most."""

    def __init__(self, per_session: int = 1, depth: int = 4):
        if per_session < 1 or depth < 1:
            raise ValueError(f"per_session and depth must be at least 1, got {per_session} and {depth}")
        self.per_session, self.depth = per_session, depth
        self._lock = threading.Lock()
        self._live: dict[object, Client] = {}  # a reservation number, then the Gradio event id -> who
        self._sessions: Counter[str] = Counter()
        self._addresses: Counter[str] = Counter()
        self._tickets = itertools.count()

    def reserve(self, client: Client) -> int:
        """A place for one request of `client` (a number to `bind` or `release`); Refused when over its share."""
        with self._lock:
            if self._sessions[client.session] >= self.per_session:
                raise Refused(SESSION_REFUSAL)
            if self._addresses[client.address] >= self.depth:
                raise Refused(ADDRESS_REFUSAL.format(depth=self.depth))
            ticket = next(self._tickets)
            self._live[ticket] = client
            self._sessions[client.session] += 1
            self._addresses[client.address] += 1
            return ticket

    def bind(self, ticket: int, event_id: str) -> None:
        """The reserved place now belongs to the queued event `event_id` (released when that event ends)."""
        with self._lock:
            self._live[event_id] = self._live.pop(ticket)

    def release(self, key: object) -> None:
        """Free the place of a reservation or an event id; nothing when it was freed already."""
        with self._lock:
            client = self._live.pop(key, None)
            if client is None:
                return
            for counts, k in ((self._sessions, client.session), (self._addresses, client.address)):
                counts[k] -= 1
                if counts[k] <= 0:
                    del counts[k]

    def joined(self, address: str | None = None) -> int:
        """Requests joined and not ended: all of them, or those of one address."""
        with self._lock:
            return len(self._live) if address is None else self._addresses.get(address, 0)
