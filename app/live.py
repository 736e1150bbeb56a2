"""Live frames of a streaming run, outside Gradio's message stream.

Every Gradio update costs the browser ~10 ms of main-thread work (message handling, Svelte, status trackers)
before anything is drawn, and on a small machine the browser shares the cores with the model. So while a run
streams, the handler posts its newest state here (new token spans, figure dicts, status line) and the page
script (app/page.js) polls `/ssd/live/<token>?n=<events shown>&v=<figure version>` a few times a second,
appending only the new spans and redrawing the plots. Gradio carries the first frame (which names the run's
token), a slow full refresh for API clients, and the final frame.

Tokens are unguessable (`secrets.token_urlsafe`); the board keeps the newest `keep` runs, and when a run
opens it forgets those that ended over `linger` seconds ago (their final Gradio frame carried everything).
"""
from __future__ import annotations

import json
import secrets
import threading
import time
from collections import OrderedDict
from urllib.parse import parse_qs

PREFIX = "/ssd/live/"


class LiveBoard:
    """Newest state of each streaming run: spans per event (append-only), figures, status, done."""

    def __init__(self, keep: int = 32, linger: float = 60.0, clock=time.monotonic) -> None:
        self._runs: OrderedDict[str, dict] = OrderedDict()
        self._lock = threading.Lock()
        self.keep, self.linger, self.clock = keep, linger, clock

    def open(self) -> str:
        token = secrets.token_urlsafe(16)
        with self._lock:
            self._forget_ended()
            self._runs[token] = {"spans": [], "figs": None, "v": 0, "status": "", "done": False, "ended": None}
            while len(self._runs) > self.keep:
                self._runs.popitem(last=False)
        return token

    def _forget_ended(self) -> None:
        now = self.clock()
        for token in [t for t, r in self._runs.items() if r["ended"] is not None and now - r["ended"] > self.linger]:
            del self._runs[token]

    def post(self, token: str, spans: list[str] = (), figs: dict | None = None, status: str | None = None,
             done: bool = False) -> None:
        """spans: one HTML string per new event, in order; figs: element id -> Plotly figure dict."""
        with self._lock:
            r = self._runs.get(token)
            if r is None:
                return
            r["spans"].extend(spans)
            if figs is not None:
                r["figs"], r["v"] = figs, r["v"] + 1
            if status is not None:
                r["status"] = status
            if done and not r["done"]:
                r["done"], r["ended"] = True, self.clock()

    def frame(self, token: str, have: int, version: int) -> dict | None:
        """What a page showing `have` events and figure version `version` lacks; None for an unknown run."""
        with self._lock:
            r = self._runs.get(token)
            if r is None:
                return None
            have = max(0, min(have, len(r["spans"])))
            return {"from": have, "n": len(r["spans"]), "spans": "".join(r["spans"][have:]), "v": r["v"],
                    "figs": r["figs"] if r["v"] != version else None, "status": r["status"], "done": r["done"]}


BOARD = LiveBoard()


class LiveRoute:
    """Pure ASGI middleware answering GET /ssd/live/<token> from the board; everything else passes through."""

    def __init__(self, app, board: LiveBoard = BOARD) -> None:
        self.app = app
        self.board = board

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if not path.startswith(PREFIX) or scope.get("method") != "GET":
            return await self.app(scope, receive, send)
        token = path.split(PREFIX, 1)[1]
        q = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        try:
            have, version = int(q.get("n", ["0"])[0]), int(q.get("v", ["0"])[0])
        except ValueError:
            have, version = 0, -1
        frame = self.board.frame(token, have, version)
        body = json.dumps(frame if frame is not None else {"error": "unknown run"}).encode()
        await send({"type": "http.response.start", "status": 200 if frame is not None else 404,
                    "headers": [(b"content-type", b"application/json"), (b"cache-control", b"no-store"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
