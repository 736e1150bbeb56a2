"""The device queue's door: a cap on runs per browser session, and when each run was queued.

Gradio's queue holds every event until a worker takes it; one client could fill it. `QueueGuard.install`
wraps the queue's `push` so that a session with `per_session` events already waiting or running cannot add a
run on the device (generate, race, probe lab; Stop always passes): it is refused with
a message (the whole queue is bounded by `queue(max_size=...)`). It also notes when each run was queued, so a
Stop pressed while a run waits in the queue cancels it before it starts (the handler compares the Stop's time
with the queueing time, not with the time it was finally dequeued).
"""
from __future__ import annotations

import threading
import time
from collections import defaultdict, deque

QUEUE_MAX = 16          # runs the whole queue holds (`queue(max_size=...)` in app.py)


class QueueGuard:
    def __init__(self, per_session: int = 2, clock=time.monotonic) -> None:
        self.per_session, self.clock = per_session, clock
        self._queued: dict[tuple[str, str], deque] = defaultdict(deque)
        self._lock = threading.Lock()

    def install(self, demo) -> None:
        q = demo._queue
        push = q.push
        names = {i: getattr(fn, "api_name", None) for i, fn in demo.fns.items()}
        device = {i for i, fn in demo.fns.items() if getattr(fn, "concurrency_id", None) == "device"}

        async def guarded_push(body, request, username):
            session = body.session_hash or ""
            waiting = len(q.pending_event_ids_session.get(session, ())) if session else 0
            if session and body.fn_index in device and waiting >= self.per_session:   # Stop etc. always pass
                return False, (f"This session already has {waiting} runs queued or running; wait for them to "
                               "finish or press Stop."), "queue_full"
            ok, *rest = await push(body, request, username)
            if ok and session:
                self.note(session, names.get(body.fn_index))
            return (ok, *rest)
        q.push = guarded_push

    def note(self, session: str, api_name: str | None) -> None:
        with self._lock:
            d = self._queued[(session, str(api_name))]
            d.append(self.clock())
            while len(d) > 8:
                d.popleft()

    def queued_at(self, session: str | None, api_name: str) -> float:
        """When the run now starting was queued (the oldest noted for this session); now if unknown."""
        with self._lock:
            d = self._queued.get((session or "", api_name))
            t = d.popleft() if d else self.clock()
            if d is not None and not d:
                del self._queued[(session or "", api_name)]
            return t


GUARD = QueueGuard()
