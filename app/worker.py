"""One thread runs every torch computation of the studio (model loading, engines, probe scoring).

Why: Gradio runs each step of a streaming handler on whichever thread of its pool is free, and torch's OpenMP
pool is per calling thread, so torch work spread over several threads pays for it. Measured on this 2-core CPU
(SwitchSD, the copy-heavy preset, 128 tokens, medians of 3 x 3 runs in fresh processes): the engine on the main
thread 15.6 Tok/s; each step on a pool thread 13.0; loading on one thread and generating on another 13.4;
loading and generating on the same (non-main) thread 15.9. So the studio keeps all of it on this thread, and
the handlers only render the events it streams back (through a queue: the engine never waits for a frame).

Python's cyclic garbage collector is paused while a job runs (any thread's allocations can trigger a collection,
which holds the GIL: 20-270 ms for the studio's heap, inside runs that last a few hundred ms) and resumes between
jobs; a run's own objects (events, frames) are freed by reference counting as usual.
"""
from __future__ import annotations

import gc
import queue
import threading
import time
from typing import Callable, Iterator, TypeVar

T = TypeVar("T")
CANCEL_MEMORY_S = 3600.0
_END = object()


def _name_os_thread(name: str) -> None:
    try:
        import ctypes
        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)     # PR_SET_NAME (Linux only)
    except (OSError, AttributeError):
        pass


class TorchThread:
    def __init__(self, name: str = "switchsd-torch") -> None:
        self._jobs: queue.Queue = queue.Queue()
        self._name = name
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._cancels: dict[str, threading.Event] = {}
        self._cancelled_at: dict[str, float] = {}       # key -> time.monotonic() of its last cancel
        self.busy = False                                # a job is running (tests: idle after a disconnect)

    def _ensure(self) -> None:
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()

    def _loop(self) -> None:
        _name_os_thread(self._name)     # shows in top -H / py-spy; OpenMP threads started from here inherit it
        while True:
            job = self._jobs.get()
            self.busy = True
            gc.disable()        # no cyclic collection in the middle of a job (the module docstring says why)
            try:
                job()
            except BaseException as e:  # noqa: BLE001 - a job's own failure must not end the thread
                import traceback
                traceback.print_exception(e)
            finally:
                self.busy = False
                gc.enable()

    def post(self, fn: Callable[[], object]) -> None:
        """Run fn on the torch thread after the jobs already queued; do not wait for it."""
        self._ensure()
        self._jobs.put(fn)

    def on_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def call(self, fn: Callable[..., T], *args, **kwargs) -> T:
        """Run fn on the torch thread and return its result (its exception is re-raised here)."""
        if self.on_thread():
            return fn(*args, **kwargs)
        self._ensure()
        box: queue.Queue = queue.Queue(maxsize=1)

        def job():
            try:
                box.put((True, fn(*args, **kwargs)))
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                box.put((False, e))
        self._jobs.put(job)
        ok, val = box.get()
        if not ok:
            raise val
        return val

    def stream(self, make_iter: Callable[[], Iterator[T]], key: str | None = None,
               since: float | None = None) -> Iterator[T]:
        """Items of make_iter(), produced on the torch thread as fast as it can and handed over through a queue.
        Once the consumer is closed or `cancel(key)` is called, the producer stops at its next item and the
        consumer gets no more items (the iteration just ends). A cancel of `key` at or after `since`
        (time.monotonic()), even one that came before this stream started, counts too."""
        self._ensure()
        out: queue.Queue = queue.Queue()
        stop = threading.Event()
        if key is not None:
            self._cancels[key] = stop
            if since is not None and self.cancelled_since(key, since):
                stop.set()

        def job():
            it = None
            try:
                if stop.is_set():
                    out.put((True, _END))
                    return
                it = make_iter()
                for x in it:
                    if stop.is_set():
                        break
                    out.put((True, x))
                out.put((True, _END))
            except BaseException as e:  # noqa: BLE001
                out.put((False, e))
            finally:
                close = getattr(it, "close", None)
                if close is not None:
                    close()
        self._jobs.put(job)
        try:
            while True:
                ok, x = out.get()
                if not ok:
                    raise x
                if x is _END or stop.is_set():
                    return
                yield x
        finally:
            stop.set()
            if key is not None and self._cancels.get(key) is stop:
                del self._cancels[key]

    def cancel(self, key: str) -> bool:
        """Stop the stream registered under key (e.g. a browser session's Stop button). Returns whether one was
        running; either way the cancel is remembered for `cancelled_since` and `stream(since=...)`."""
        now = time.monotonic()
        self._cancelled_at[key] = now
        if len(self._cancelled_at) > 1024:                # forget cancels older than any run still waiting
            self._cancelled_at = {k: t for k, t in self._cancelled_at.items() if now - t < CANCEL_MEMORY_S}
        ev = self._cancels.get(key)
        if ev is None:
            return False
        ev.set()
        return True

    def cancelled_since(self, key: str, t: float) -> bool:
        return self._cancelled_at.get(key, float("-inf")) >= t
