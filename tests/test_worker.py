"""The studio's plumbing: one torch thread, the early <head> script, the quiet Gradio queue."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from app.early_js import EARLY_JS, EarlyScript
from app.worker import TorchThread


def test_call_runs_on_one_thread_and_reraises():
    w = TorchThread()
    ids = {w.call(threading.get_ident) for _ in range(5)}
    assert len(ids) == 1 and threading.get_ident() not in ids
    with pytest.raises(ZeroDivisionError):
        w.call(lambda: 1 / 0)
    assert w.call(lambda: w.call(lambda: 7)) == 7          # nested calls run inline, no deadlock


def test_cyclic_gc_pauses_during_a_job_and_resumes_after():
    import gc
    w = TorchThread()
    assert gc.isenabled()
    assert w.call(gc.isenabled) is False                       # a collection would hold the GIL mid-run
    assert list(w.stream(lambda: iter([gc.isenabled()]))) == [False]
    with pytest.raises(ZeroDivisionError):
        w.call(lambda: 1 / 0)
    deadline = time.monotonic() + 5        # the thread re-enables it right after handing the result over
    while not gc.isenabled() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert gc.isenabled()                                      # back on between jobs, failed ones included


def test_settle_heap_exempts_live_objects_from_collection():
    import gc

    from app.resources import settle_heap
    try:
        settle_heap()
        assert gc.get_freeze_count() > 1000                   # the objects alive at the call
    finally:
        gc.unfreeze()


def test_stream_yields_everything_on_the_torch_thread():
    w = TorchThread()
    seen = []

    def gen():
        for i in range(5):
            seen.append(threading.get_ident())
            yield i
    assert list(w.stream(gen)) == [0, 1, 2, 3, 4]
    assert len(set(seen)) == 1 and seen[0] == w.call(threading.get_ident)


def test_stream_error_reaches_the_consumer():
    w = TorchThread()

    def gen():
        yield 1
        raise RuntimeError("boom")
    it = w.stream(gen)
    assert next(it) == 1
    with pytest.raises(RuntimeError, match="boom"):
        next(it)


def _slow(n, produced, closed):
    try:
        for i in range(n):
            produced.append(i)
            time.sleep(0.01)
            yield i
    finally:
        closed.set()


def test_closing_the_consumer_stops_the_producer():
    w = TorchThread()
    produced, closed = [], threading.Event()
    it = w.stream(lambda: _slow(1000, produced, closed))
    assert next(it) == 0
    it.close()
    assert closed.wait(5), "the producer's generator was not closed"
    assert len(produced) < 1000


def test_cancel_by_key_stops_the_stream():
    w = TorchThread()
    produced, closed = [], threading.Event()
    it = w.stream(lambda: _slow(1000, produced, closed), key="session-a")
    assert next(it) == 0
    assert not w.cancel("session-b")                        # another session's Stop does nothing here
    assert w.cancel("session-a")
    rest = list(it)                                         # ends early, without an error
    assert closed.wait(5) and len(rest) < 999


def test_cancel_before_the_stream_starts_counts_from_since():
    """A Stop that comes while the engine is still being built: the stream started afterwards with an earlier
    `since` produces nothing; one started with a later `since` (the next run) is not affected."""
    w = TorchThread()
    t0 = time.monotonic()
    assert not w.cancel("s")                                # nothing running yet
    assert w.cancelled_since("s", t0) and not w.cancelled_since("other", t0)
    produced, closed = [], threading.Event()
    assert list(w.stream(lambda: _slow(1000, produced, closed), key="s", since=t0)) == [] and produced == []
    later = time.monotonic()
    assert list(w.stream(lambda: iter(range(3)), key="s", since=later)) == [0, 1, 2]


def _asgi(app, path, method="GET"):
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(m):
        sent.append(m)
    asyncio.run(app({"type": "http", "method": method, "path": path, "headers": []}, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return dict(start["headers"]), body


def _page(ctype=b"text/html; charset=utf-8", body=b"<html><head><title>t</title></head><body></body></html>",
          extra=()):
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", ctype), (b"content-length", str(len(body)).encode()), *extra]})
        half = len(body) // 2                                # two chunks: the middleware must join them
        await send({"type": "http.response.body", "body": body[:half], "more_body": True})
        await send({"type": "http.response.body", "body": body[half:]})
    return app


def test_early_script_goes_first_in_the_head_of_the_index():
    headers, body = _asgi(EarlyScript(_page()), "/")
    assert body.startswith(b"<html><head>" + EARLY_JS.encode())
    assert int(headers[b"content-length"]) == len(body)


@pytest.mark.parametrize("path,ctype,extra", [("/gradio_api/info", b"application/json", ()),
                                              ("/assets/x.js", b"text/html", ()),
                                              ("/", b"text/html", ((b"content-encoding", b"br"),))])
def test_early_script_leaves_other_responses_alone(path, ctype, extra):
    body = b"<html><head></head></html>"
    _, out = _asgi(EarlyScript(_page(ctype, body, extra)), path)
    assert out == body


def test_quiet_queue_slows_the_idle_polling():
    import gradio as gr

    from app.studio import quiet_queue
    with gr.Blocks() as demo:
        gr.Textbox()
    q = quiet_queue(demo.queue())._queue
    assert q.sleep_when_free >= 0.05 and q.progress_update_sleep_when_free >= 0.25
