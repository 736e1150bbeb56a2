"""The studio against hostile or careless use: knobs, the device queue, Stop, disconnects, leaked hooks, state.
API-level through gradio_client against the real app (offline model), and in-process where the internals matter."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

STORY = ("Write a very long story about a dragon who learns to bake bread, with many chapters.", "vanilla", 0.0,
         1024, True, False, 0.5, 5, 10, 20, 0, "auto")


@pytest.fixture(scope="module")
def server():
    from app_server import AppServer
    s = AppServer()
    yield s
    s.close()


def _cpu_s(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")      # utime + stime


def _wait(pred, timeout: float, every: float = 0.2):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if pred():
            return True
        time.sleep(every)
    return False


def _code(job) -> str:
    return job.status().code.name


def _cancel(job, tries: int = 3) -> None:
    """job.cancel(), retried: its HTTP call has a 5 s read timeout, which a server busy decoding on a loaded 2-core
    CPU can exceed once; whether the run really ends is what the callers assert."""
    import httpx
    for i in range(tries):
        try:
            job.cancel()
            return
        except httpx.TimeoutException:
            if i == tries - 1:
                raise
            time.sleep(1.0)


def _within(fn, timeout: float = 30.0):
    """fn() in a daemon thread; fails (instead of hanging the suite) when it does not return in time."""
    import threading
    box = []
    t = threading.Thread(target=lambda: box.append(fn()), daemon=True)
    t.start()
    t.join(timeout)
    assert box, f"no answer within {timeout} s (a dead or deadlocked torch thread)"
    return box[0]


@pytest.mark.real
def test_knobs_non_finite_refused_and_tau_zero_honoured(server):
    """NaN / inf cannot travel as JSON through gradio_client, so they are fed to the handler itself (a raw HTTP
    client can send them); the rest goes through the API."""
    import gradio as gr
    from gradio_client import Client

    from app import handlers
    from app.resources import Resources
    res = Resources()
    base = ["Repeat exactly: red green blue red green blue red green blue.", "switchsd", 0.0, 12, True, None,
            3, 10, 20, 0]
    for i, bad, msg in [(5, float("nan"), "tau must be a finite number"), (2, float("inf"), "temperature"),
                        (6, float("nan"), "kappa must be a finite"), (3, float("nan"), "(?i)max new tokens")]:
        args = list(base)
        args[i] = bad
        with pytest.raises(gr.Error, match=msg):
            list(handlers.generate(res, *args))
    c = Client(server.url, verbose=False)
    api = ["Repeat exactly: red green blue red green blue red green blue.", "switchsd", 1e-300, 12, True, False, 0.5,
           3, 10, 20, 0, "float32"]
    with pytest.raises(Exception, match="temperature must be 0"):
        c.predict(*api, api_name="/generate")
    api[2], api[5], api[6] = 0.0, True, 0.0          # override the probe's tau with 0.0: a value, not "unset"
    html_ = c.predict(*api, api_name="/generate")[0]
    assert "tau 0.00" in html_ and "tau 0.45" not in html_


@pytest.mark.real
def test_one_session_cannot_fill_the_queue(server):
    from gradio_client import Client
    c = Client(server.url, verbose=False)
    jobs = [c.submit(*STORY, api_name="/generate") for _ in range(2)]
    try:
        assert _wait(lambda: all(_code(j) not in ("STARTING", "JOINING_QUEUE") for j in jobs), 30)
        import httpx
        r = httpx.post(server.url + "gradio_api/queue/join",
                       json={"data": list(STORY), "fn_index": c._infer_fn_index("/generate", None),
                             "session_hash": c.session_hash, "event_data": None, "trigger_id": None})
        assert r.status_code == 503 and "already has 2 runs" in r.text
        other = Client(server.url, verbose=False)     # another session is still welcome (the queue has room)
        j = other.submit(*STORY, api_name="/generate")
        assert _wait(lambda: _code(j) in ("IN_QUEUE", "PROCESSING", "ITERATING"), 30)
        _cancel(j)
    finally:
        c.predict(api_name="/stop")
        for j in jobs:
            _cancel(j)
        assert _wait(lambda: all(j.done() for j in jobs), 60)


@pytest.mark.real
def test_five_clients_stop_disconnect_and_idle(server):
    """5 sessions start 1024-token runs at once. A Stop from another session never stops the running one; a
    Stop while queued means that run never starts; a client that leaves mid-run leaves the torch thread idle
    within 3 s; every run ends (stopped, cancelled or finished), none hangs."""
    from gradio_client import Client
    clients = [Client(server.url, verbose=False) for _ in range(5)]
    jobs = [c.submit(*STORY, api_name="/generate") for c in clients]
    assert _wait(lambda: any(_code(j) in ("ITERATING", "PROCESSING") and j.outputs() for j in jobs), 120)
    run = next(i for i, j in enumerate(jobs) if _code(j) in ("ITERATING", "PROCESSING") and j.outputs())
    queued = [i for i in range(5) if i != run]
    stop_queued, leave_queued = queued[0], queued[1]
    clients[stop_queued].predict(api_name="/stop")            # Stop while queued (another session than `run`)
    _cancel(jobs[leave_queued])                               # a queued client leaves
    n0 = len(jobs[run].outputs())
    import urllib.request
    for _ in range(3):                                        # the page stays responsive while 5 runs queue
        t0 = time.time()
        urllib.request.urlopen(server.url, timeout=10).read()
        assert time.time() - t0 < 2.0
    time.sleep(5)                                             # the running run goes on (full frames every 3 s)
    assert len(jobs[run].outputs()) > n0 and not jobs[run].done(), "another session's Stop stopped this run"
    clients[run].predict(api_name="/stop")
    assert _wait(jobs[run].done, 30)
    assert "Stopped" in jobs[run].outputs()[-1][1]
    # the next run to start (whatever the queue order) belongs to a client that leaves mid-run; the last one is
    # stopped while it waits; the torch thread must be idle within 3 s of the leaver's departure
    rest = queued[2:]
    started = lambda i: _code(jobs[i]) in ("ITERATING", "PROCESSING") and jobs[i].outputs()     # noqa: E731
    assert _wait(lambda: any(started(i) for i in rest), 120), [(_code(jobs[i]), len(jobs[i].outputs())) for i in rest]
    leaver = next(i for i in rest if started(i))
    last = next(i for i in rest if i != leaver)
    _cancel(jobs[leaver])
    clients[last].predict(api_name="/stop")
    time.sleep(3)
    c0 = _cpu_s(server.proc.pid)
    time.sleep(2)
    assert _cpu_s(server.proc.pid) - c0 < 0.5, "the server keeps computing after its clients left"
    assert all(_wait(j.done, 30) for j in jobs)
    assert "before the first token" in jobs[stop_queued].outputs()[-1][1], "a Stop while queued must win"
    assert "Stopped" in jobs[last].outputs()[-1][1]


@pytest.mark.real
def test_race_leaks_no_hooks_and_state_keeps_no_hidden_vectors():
    """With transformers' forward (hooks capture the probe's and EAGLE-3's hidden states): a race left mid-way
    and 3 finished races leave no hook on the model; the inspector's state holds no hidden vectors."""
    from app import handlers, race
    from app.resources import Resources
    res = Resources(forward="hf", dtype="float32")
    model = res.lm().model

    def hooks() -> int:
        return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())
    assert hooks() == 0
    gen = race.race(res, "Repeat exactly: one two three four five six seven eight.", 8, True, repeats=1)
    for _ in range(3):               # vanilla ran, switchsd is running or about to
        next(gen)
    gen.close()                      # the client left
    res.worker.call(lambda: None)    # whatever the thread was doing has finished
    assert hooks() == 0
    for _ in range(3):
        for _frame in race.race(res, "Repeat exactly: alpha beta gamma delta.", 6, True, replay_speed=1e9, repeats=1):
            pass
    assert hooks() == 0
    frames = list(handlers.generate(res, "Repeat exactly: a b c d e f a b c d e f.", "switchsd", 0.0, 12, True,
                                    None, 3, 10, 20, 0))
    state = frames[-1].state
    assert state["events"] and all(e.hidden is None for e in state["events"])
    res.worker.call(lambda: None)
    assert hooks() == 0


@pytest.mark.real
def test_race_runs_without_a_probe():
    """A model setup without a probe loses the SwitchSD lane, not the whole race."""
    from app import race
    from app.resources import Resources
    res = Resources(probe="/nonexistent/probe.safetensors")
    frames = list(race.race(res, "Repeat exactly: one two three one two three.", 8, True, replay_speed=1e9, repeats=1))
    lanes, status = frames[-1].lanes, frames[-1].status
    assert 'data-lane="vanilla"' in lanes and 'data-lane="eagle3"' in lanes and 'data-lane="copyspec"' in lanes
    assert 'data-lane="switchsd"' not in lanes and "switchsd skipped" in status


def test_worker_survives_a_failing_job_and_forgets_old_cancels():
    from app.worker import TorchThread
    w = TorchThread("test-worker")

    class Boom:
        def __iter__(self):
            return self

        def __next__(self):
            return 1

        def close(self):
            raise RuntimeError("close failed")           # escapes the stream job's own handling
    for _ in zip(range(2), w.stream(lambda: Boom())):
        pass
    assert _within(lambda: w.call(lambda: 41 + 1), 10) == 42        # the thread lives on
    t0 = time.monotonic()
    for i in range(1100):
        w.cancel(f"s{i}")
    assert len(w._cancelled_at) == 1100 and w.cancelled_since("s0", t0)   # recent cancels are all kept
    w._cancelled_at = {k: t - 7200 for k, t in w._cancelled_at.items()}  # two hours later
    w.cancel("new")
    w.cancel("newer")
    assert set(w._cancelled_at) == {"new", "newer"} and not w.cancelled_since("s0", t0)   # old ones forgotten


def test_live_route_answers_its_prefix_only():
    import asyncio

    from app.live import LiveBoard, LiveRoute
    sent = []

    async def app_(scope, receive, send):
        sent.append("passed")

    async def send(m):
        sent.append(m)
    asyncio.run(LiveRoute(app_, LiveBoard())({"type": "http", "method": "GET", "path": "/x/ssd/live/abc",
                                              "query_string": b""}, None, send))
    assert sent == ["passed"]


def test_queue_guard_caps_a_session_and_remembers_when_runs_were_queued():
    import asyncio
    from types import SimpleNamespace

    from app.guard import QueueGuard
    now = [10.0]
    g = QueueGuard(per_session=2, clock=lambda: now[0])
    pending: dict = {}

    async def push(body, request, username):
        pending.setdefault(body.session_hash, set()).add(len(pending.get(body.session_hash, ())))
        return True, "ok", "success"
    demo = SimpleNamespace(_queue=SimpleNamespace(push=push, pending_event_ids_session=pending),
                           fns={0: SimpleNamespace(api_name="generate", concurrency_id="device"),
                                1: SimpleNamespace(api_name="stop", concurrency_id=None)})
    g.install(demo)
    body = SimpleNamespace(session_hash="s", fn_index=0)
    assert asyncio.run(demo._queue.push(body, None, None))[0]
    now[0] = 11.0
    assert asyncio.run(demo._queue.push(body, None, None))[0]
    ok, msg, kind = asyncio.run(demo._queue.push(body, None, None))
    assert not ok and kind == "queue_full" and "already has 2 runs" in msg
    assert asyncio.run(demo._queue.push(SimpleNamespace(session_hash="s", fn_index=1), None, None))[0]   # Stop
    assert asyncio.run(demo._queue.push(SimpleNamespace(session_hash="t", fn_index=0), None, None))[0]
    assert g.queued_at("s", "generate") == 10.0 and g.queued_at("s", "generate") == 11.0
    now[0] = 12.0
    assert g.queued_at("s", "generate") == 12.0          # unknown: now


def test_status_is_refreshed_when_a_page_loads():
    from app.resources import Resources
    from app.studio import build_demo
    demo = build_demo(Resources())
    status_id = next(b._id for b in demo.blocks.values() if getattr(b, "elem_id", None) == "model-status")
    loads = [fn for fn in demo.fns.values()
             if any(t[1] == "load" for t in fn.targets) and any(o._id == status_id for o in fn.outputs)]
    assert loads, "the model status is set at build time only"


@pytest.mark.real
def test_rest_routes_do_not_skip_the_queue(server):
    """A well-formed direct call (it would run with `api_open=True`) is refused; the queue path serves it."""
    import httpx
    from gradio_client import Client

    from app.resources import Resources
    data = [Resources().shipped_probes()[0], "", None, "The cat sat on the mat. The cat sat on the mat.", False]
    r = httpx.post(server.url + "gradio_api/run/probe_lab", json={"data": data}, timeout=60)
    assert r.status_code != 200 and "tok" not in r.text
    assert 'class="tok' in Client(server.url, verbose=False).predict(*data, api_name="/probe_lab")[0]


@pytest.mark.real
def test_uploads_are_not_cached_and_loads_never_hold_a_lock(tmp_path):
    """An uploaded probe is read for its request only; a torch-thread job asking for the model while another
    thread loads it finishes (the old lock held across the load could deadlock)."""
    import threading

    from app.resources import Resources
    from switchsd.factory import DEFAULT_PROBES
    from switchsd.models.loading import DEFAULT_MODEL
    res = Resources()
    got = []
    res.worker.post(lambda: (time.sleep(0.2), got.append(res.lm())))
    t = threading.Thread(target=lambda: got.append(res.lm()))
    t.start()
    t.join(120)
    assert not t.is_alive(), "deadlock: the lock is held while waiting for the torch thread"
    assert _within(lambda: res.worker.call(lambda: len(got))) == 2 and got[0] is got[1]
    import shutil

    from gradio.utils import get_upload_folder
    up = Path(get_upload_folder()) / "switchsd-test" / "mine.safetensors"      # where Gradio puts uploads
    up.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(DEFAULT_PROBES[DEFAULT_MODEL], up)
    try:
        assert res.load_upload(str(up)).site and res._probes == {}
    finally:
        shutil.rmtree(up.parent)


def test_cli_refuses_non_finite_sampling_and_bad_auth():
    import argparse

    from switchsd.cli.common import add_decode_args, engine_config
    ap = argparse.ArgumentParser()
    add_decode_args(ap)
    for t in ("inf", "nan", "1e-300", "-1"):
        with pytest.raises(SystemExit, match="temperature"):
            engine_config(ap.parse_args(["--temperature", t]), 8)
    import importlib.util
    from pathlib import Path

    import app as app_script  # the package app/ shadows app.py: load the script by path
    spec = importlib.util.spec_from_file_location("app_script", Path(app_script.__path__[0]).parent / "app.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with pytest.raises(SystemExit):
        mod.main(["--auth", "no-colon"])
    with pytest.raises(SystemExit):
        mod.main(["--threads", "0"])


def test_state_expires_and_probe_weight_moves_once(monkeypatch):
    import gradio as gr
    import torch

    from app.resources import Resources
    from app.studio import STATE_TTL_S, build_demo
    from switchsd.core.probe import Probe
    demo = build_demo(Resources())
    states = [b for b in demo.blocks.values() if isinstance(b, gr.State)]
    assert states and all(b.time_to_live == STATE_TTL_S for b in states)
    p = Probe(torch.randn(8), 0, "attn", 0.5)
    moves = []
    real_to = torch.Tensor.to
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *a, **k: moves.append(1) or real_to(self, *a, **k))
    for _ in range(5):
        p.score(torch.randn(8))
    assert len(moves) == 1


def test_a_transformers_that_ignores_the_cache_is_refused(tiny_model, monkeypatch):
    from switchsd.core.config import EngineConfig
    from switchsd.core.policies import Fixed
    from switchsd.factory import make_engine
    eng = make_engine(tiny_model, Fixed([]), EngineConfig(max_new_tokens=4, forward="hf"), ())
    real = tiny_model.forward
    monkeypatch.setattr(tiny_model, "forward", lambda *a, **k: real(*a, **{**k, "cache": None}))
    with pytest.raises(RuntimeError, match="ignored cache="):
        eng.run([1, 2, 3])


@pytest.mark.real
def test_a_lone_surrogate_over_the_api_is_refused_in_one_line(server):
    """JSON carries a lone surrogate ("\\ud800", as any client may send it; gradio_client itself cannot encode
    one); the studio names it instead of handing it to the tokenizer."""
    import json

    import httpx
    from gradio_client import Client
    c = Client(server.url, verbose=False)
    data = list(STORY)
    data[0], data[3] = "Repeat: \ud800 then stop", 8
    body = json.dumps({"data": data, "fn_index": c._infer_fn_index("/generate", None),
                       "session_hash": "surrogate-test", "event_data": None, "trigger_id": None})   # ASCII escapes
    r = httpx.post(server.url + "gradio_api/queue/join", content=body, timeout=30,
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text[:200]
    seen = ""
    with httpx.stream("GET", server.url + "gradio_api/queue/data", params={"session_hash": "surrogate-test"},
                      timeout=120) as stream:
        for line in stream.iter_lines():
            seen += line
            if "process_completed" in line:
                break
    assert "lone surrogate U+D800" in seen, seen[-400:]




@pytest.mark.real
def test_the_global_queue_refuses_its_seventeenth_run(server):
    """The queue holds QUEUE_MAX (16) waiting runs, two per session at most, beside the one running: nine sessions
    fill it, a tenth session's run is refused with a message (HTTP 503), and the queue serves again once it
    drains."""
    import httpx
    from gradio_client import Client

    from app.guard import GUARD, QUEUE_MAX
    fn = Client(server.url, verbose=False)._infer_fn_index("/generate", None)
    short = list(STORY)
    short[3] = 16                        # the waiting runs: a second each, so the queue drains soon after

    def join(session: str, data: list | tuple = short) -> httpx.Response:
        return httpx.post(server.url + "gradio_api/queue/join", timeout=30,
                          json={"data": list(data), "fn_index": fn, "session_hash": session, "event_data": None,
                                "trigger_id": None})

    def waiting() -> int:
        return httpx.get(server.url + "gradio_api/queue/status", timeout=10).json()["queue_size"]
    sessions = [f"fill-{i}" for i in range(QUEUE_MAX // GUARD.per_session + 1)]
    # the run that starts first is the long story (tens of seconds): the queue stays full while the rest join
    slots = [s for s in sessions for _ in range(GUARD.per_session)][:QUEUE_MAX + 1]      # 1 running + 16 waiting
    first = [join(slots[0], STORY)] + [join(s) for s in slots[1:]]
    assert [r.status_code for r in first] == [200] * (QUEUE_MAX + 1), [r.text[:80] for r in first]
    assert waiting() >= QUEUE_MAX - 1
    refused = join("one-more")
    assert refused.status_code == 503 and "full" in refused.text.lower(), refused.text[:200]
    assert _wait(lambda: waiting() == 0, 600, every=1.0), "the queue did not drain"
    assert join("after").status_code == 200
