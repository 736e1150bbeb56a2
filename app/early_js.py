"""A script that must run before Gradio's own modules, injected into the page's <head> by an ASGI middleware.

Gradio's status trackers keep a 60 fps requestAnimationFrame loop going for their elapsed-time counters: while
a run is pending (also for outputs whose progress display is hidden) and, in Gradio 6, even on an idle page (a
bare `gr.Blocks` with one Textbox shows it too). On a 2-core machine the browser then takes ~6% of a core from
the model for nothing. The trackers capture `window.requestAnimationFrame` when their module loads, so the
`head=` option of `launch` (inserted by the page's JavaScript, after the modules) comes too late; this script
is placed first in the served HTML and defers only the trackers' frames to 2 per second. Measured with headless
Chromium: idle page 0.65 -> 0.16 CPU-seconds per 10 s.
"""
from __future__ import annotations

EARLY_JS = """<script>
(function(){
  var raf = window.requestAnimationFrame.bind(window);
  window.requestAnimationFrame = function(cb){
    var s = (new Error()).stack || '';
    if (s.indexOf('statustracker') >= 0) { return setTimeout(function(){ raf(cb); }, 500); }
    return raf(cb);
  };
})();
</script>"""


class EarlyScript:
    """Pure ASGI middleware: puts `snippet` right after <head> in HTML pages answered with a full body (the
    studio's index); every other response (files, SSE streams, API calls) passes through untouched."""

    def __init__(self, app, snippet: str = EARLY_JS) -> None:
        self.app = app
        self.snippet = snippet.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("method") != "GET" or scope.get("path", "/") not in ("/", ""):
            return await self.app(scope, receive, send)
        start: dict = {}
        body: list[bytes] = []
        passthrough = False

        async def wrapped(message):
            nonlocal start, passthrough
            if message["type"] == "http.response.start":
                headers = dict(message.get("headers") or [])
                if not headers.get(b"content-type", b"").startswith(b"text/html") or headers.get(b"content-encoding"):
                    passthrough = True
                    return await send(message)
                start = message
                return
            if passthrough:
                return await send(message)
            body.append(message.get("body", b""))
            if message.get("more_body"):
                return
            html = b"".join(body).replace(b"<head>", b"<head>" + self.snippet, 1)
            headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
            headers.append((b"content-length", str(len(html)).encode()))
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": html})

        await self.app(scope, receive, wrapped)
