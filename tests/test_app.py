"""The studio through its API (gradio_client) and the HTML builder against hostile model text."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from app.render import heat_strip, token_spans, tokens_html
from switchsd.core.events import StepEvent

ROOT = Path(__file__).resolve().parents[1]
HOSTILE = ["<script>alert(1)</script>", "${7*7}", "\\", "   ", "\n", "\"'><img src=x onerror=alert(1)>", "&amp;",
           "{{x}}", "</span></div>"]


class FakeTok:
    def decode(self, ids, skip_special_tokens=False):
        return "".join(HOSTILE[i % len(HOSTILE)] for i in ids)


def ev(step, path, new, accepted, probe=None, match=None, cand=None):
    return StepEvent(step=step, path=path, drafter=path, candidates=[new[:accepted]] if accepted else [],
                     tree_tokens=[0] + new[:accepted], tree_parents=[-1] + list(range(accepted)),
                     accepted_rows=list(range(1, accepted + 1)), accepted=new[:accepted],
                     accepted_candidate=cand, bonus=new[-1], new_tokens=new, position=10 + step * 5,
                     probe_score=probe, match=match)


def test_inspector_opens_on_the_best_neural_step():
    """handlers.default_step: the neural step that landed the most drafts (earliest on ties), else the best step of
    any path, else step 0; inspect_last_run sets the slider to it and renders that step."""
    from app.handlers import default_step, inspect_last_run
    copy4, copy1, neural2, neural2b, plain = (ev(0, "copy", [1, 2, 3, 4, 5], 4), ev(1, "copy", [1, 2], 1),
                                              ev(2, "neural", [1, 2, 3], 2), ev(3, "neural", [4, 5, 6], 2),
                                              ev(4, "vanilla", [7], 0))
    assert default_step([copy4, copy1, neural2, neural2b, plain]) == 2
    assert default_step([copy1, plain, copy4]) == 2
    assert default_step([plain, ev(1, "neural", [3], 0)]) == 0 and default_step([]) == 0
    neural2.gate = {"mode": "cost", "probe": 0.1, "tau": 0.5, "kgram_match": False, "copy": False,
                    "choice": "neural", "expected_tok_s": {"chain2": 20.0}, "neural_conf": [0.91, 0.5]}
    update, view = inspect_last_run({"events": [plain, neural2], "tokenizer": FakeTok()})
    assert update["value"] == 1 and update["maximum"] == 1 and "<b>Step 2</b>" in view
    assert "probability of each chain token: 0.91, 0.50" in view       # the confidence gate's reasons
    update, view = inspect_last_run(None)
    assert update["value"] == 0 and "Generate something first" in view


def test_html_builder_escapes_hostile_tokens():
    events = [ev(0, "copy", [0, 1, 2, 3], 3, 0.9, {"ngram": [1], "sources": [2]}, 0), ev(1, "neural", [4, 5, 6], 2),
              ev(2, "vanilla", [7], 0)]
    out = tokens_html(FakeTok(), events, 0.5, prompt_ids=list(range(9)))
    assert "<script>alert" not in out and "<img" not in out
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in out
    assert "&quot;&#x27;&gt;&lt;img" in out
    assert "&lt;/span&gt;&lt;/div&gt;" in out
    # one span per generated token, with the stable data attributes
    assert out.count('class="tok') == 4 + 3 + 1
    assert out.count('data-path="copy"') == 3 and out.count('data-path="bonus"') == 3
    assert 'data-probe="0.9000"' in out and 'data-src="2"' in out
    assert out.count('class="card"') == 4 + 3 + 1 and "copied from position 2" in out
    assert token_spans(FakeTok(), events, 0.5) in out and 'data-n="3"' in out
    strip = heat_strip(FakeTok(), [0, 1, 2], [0.1, 0.6, 0.9], [False, True, True], 0.5)
    assert "<script>alert" not in strip and "&lt;script&gt;" in strip


@pytest.fixture(scope="module")
def server():
    from app_server import AppServer
    old = os.environ.get("SWITCHSD_FIRST_FRAME_S")
    os.environ["SWITCHSD_FIRST_FRAME_S"] = "0"        # live frames from the first step, even in a short run
    try:
        s = AppServer()
    finally:
        os.environ.pop("SWITCHSD_FIRST_FRAME_S") if old is None else os.environ.update(SWITCHSD_FIRST_FRAME_S=old)
    yield s
    s.close()


@pytest.mark.real
def test_api_generation_streams_and_errors(server):
    from gradio_client import Client
    c = Client(server.url, verbose=False)
    args = ('Repeat this JSON exactly: {"a": 1, "b": "<script>x</script>", "c": [1, 2, 3]}', "copy", 0.0, 64, True,
            False, 0.5, 5, 10, 20, 0, "auto")
    outs = list(c.submit(*args, api_name="/generate"))
    assert len(outs) >= 3, "the generation streams several updates"
    final_html, status = outs[-1][0], outs[-1][1]
    assert 'data-path="copy"' in final_html
    assert "<script>x" not in final_html and "&lt;" in final_html   # model text is escaped token by token
    assert "tok/s" in status
    for bad, msg in [(("",) + args[1:], "empty"), ((args[0], "copy", 0.0, 5000) + args[4:], "between|maximum"),
                     (("x" * 20001,) + args[1:], "characters")]:
        with pytest.raises(Exception, match=msg):
            c.predict(*bad, api_name="/generate")


@pytest.mark.real
def test_api_stop_cancels(server):
    import time

    from gradio_client import Client
    c = Client(server.url, verbose=False)
    job = c.submit("Write a long story about a dragon.", "vanilla", 0.0, 1024, True, False, 0.5, 5, 10, 20, 0,
                   "auto", api_name="/generate")
    t0 = time.time()               # cancel at the first streamed frame (q4q8 writes 1,024 tokens in ~5 s)
    while not any(o and o[1] for o in job.outputs()) and time.time() - t0 < 60:
        time.sleep(0.05)
    job.cancel()
    t0 = time.time()
    while not job.done() and time.time() - t0 < 30:
        time.sleep(0.5)
    outs = job.outputs()
    assert job.done()
    statuses = [o[1] for o in outs if o and o[1]]
    assert statuses, "the run streamed frames before the cancel"
    assert "1024 tokens" not in statuses[-1] and "<b>Done</b>" not in statuses[-1], "cancelled before the end"


@pytest.mark.real
def test_api_race_returns_three_lossless_lanes(server):
    from gradio_client import Client

    from app.resources import Resources
    if Resources().default_method() != "switchsd":
        pytest.skip("the race needs the shipped EAGLE3 head and probe")
    c = Client(server.url, verbose=False)
    outs = list(c.submit("Repeat exactly: alpha beta gamma delta epsilon zeta eta theta iota kappa.", 24, True, True,
                         "float32", 1, True, api_name="/race"))      # 1 run per lane, + EAGLE3 without its gate
    lanes, status = outs[-1][0], outs[-1][1]
    assert lanes.count('class="ssd-lane"') == 5, "the vanilla lane is shown by default"
    for m in ("vanilla", "switchsd", "eagle3", "copyspec", "eagle3 (no cost gate)"):
        assert f'data-lane="{m}"' in lanes
    assert lanes.count("lossless ✓ equal to vanilla") == 4, "float32, T=0: every lane equals vanilla"
    assert lanes.count("x vanilla") == 4, "each lane shows its speedup over vanilla"
    assert lanes.count('class="ssd-paths"') == 5, "each lane shows its paths"
    assert "replay" in status and "warm-up" in status


@pytest.mark.real
def test_api_probe_lab_scores_and_rejects_bad_files(server, tmp_path):
    from gradio_client import Client, handle_file

    from app.resources import Resources
    c = Client(server.url, verbose=False)
    shipped = Resources().shipped_probes()
    if shipped:
        view, _, tau = c.predict(shipped[0], "", None, "The cat sat on the mat. The cat sat on the mat.", False,
                                     api_name="/probe_lab")
        assert 'class="tok' in view and 0.0 < tau < 1.0
    # server paths never load: an existing file and a missing one get the same refusal
    msgs = []
    for path in ("/etc/passwd", str(tmp_path / "missing.safetensors")):
        with pytest.raises(Exception) as e:
            c.predict(path, "", None, "some text", False, api_name="/probe_lab")
        msgs.append(str(e.value).replace(path, "PATH"))
    assert msgs[0] == msgs[1] and "not in the list of choices" in msgs[0]
    junk = tmp_path / "junk.safetensors"
    junk.write_text("not a probe")
    with pytest.raises(Exception, match="not a safetensors probe"):   # an upload that is not a probe
        c.predict(shipped[0], "", handle_file(str(junk)), "some text", False, api_name="/probe_lab")
    big = tmp_path / "big.safetensors"
    big.write_bytes(b"\0" * (2 << 20))
    with pytest.raises(Exception, match="(?i)size|large"):             # over the upload limit: refused unread
        c.predict(shipped[0], "", handle_file(str(big)), "some text", False, api_name="/probe_lab")
    with pytest.raises(Exception, match="20001 characters"):           # checked before tokenising
        c.predict(shipped[0], "", None, "x" * 20001, False, api_name="/probe_lab")
    with pytest.raises(Exception, match="prompt has .* tokens"):        # too long to generate from: a clear message
        c.predict(shipped[0], "", None, "word " * 3000, True, api_name="/probe_lab")


def test_live_board_frames_and_route():
    """The live board (app/live.py): a page showing n events gets exactly the spans after them, the figures only
    when their version changed, and unknown runs are a 404 from the ASGI route."""
    import asyncio
    import json

    from app.live import LiveBoard, LiveRoute
    from app.plots import toks_plot
    board = LiveBoard(keep=2)
    tok = board.open()
    assert len(tok) >= 20 and board.open() != tok
    fig = {"plot-toks": toks_plot({'"><script>alert(1)</script>': ([1.0], [2])})}
    board.post(tok, ["<a>", "<b>"], fig, "s1")
    f = board.frame(tok, 0, 0)
    assert f["from"] == 0 and f["n"] == 2 and f["spans"] == "<a><b>" and f["v"] == 1 and f["figs"] == fig
    board.post(tok, ["<c>"], None, "s2")
    f = board.frame(tok, 2, 1)
    assert f["spans"] == "<c>" and f["figs"] is None and f["status"] == "s2" and not f["done"]
    assert board.frame(tok, 99, 1)["from"] == 3                    # clamped: never a negative slice
    board.post(tok, done=True)
    assert board.frame(tok, 3, 1)["done"]
    board.open()
    board.open()                                                  # keeps the newest 2 runs
    assert board.frame(tok, 0, 0) is None
    now = [0.0]
    timed = LiveBoard(keep=8, linger=60, clock=lambda: now[0])
    a, b = timed.open(), timed.open()
    timed.post(a, ["<a>"], done=True)
    now[0] = 59.0
    timed.post(b, ["<b>"])
    assert timed.frame(a, 0, 0)["spans"] == "<a>"                 # an ended run lingers for the page's last poll
    now[0] = 61.0
    timed.open()
    assert timed.frame(a, 0, 0) is None and timed.frame(b, 0, 0)["spans"] == "<b>"   # then it is freed

    async def call(path, query=b""):
        sent = []

        async def send(m):
            sent.append(m)

        async def passthrough(scope, receive, send):
            sent.append("passed")
        await LiveRoute(passthrough, board)({"type": "http", "method": "GET", "path": path, "query_string": query},
                                            None, send)
        return sent
    t2 = board.open()
    board.post(t2, ["<x>"], fig, "s")
    out = asyncio.run(call(f"/ssd/live/{t2}", b"n=0&v=0"))
    assert out[0]["status"] == 200 and json.loads(out[1]["body"])["figs"] == fig
    assert asyncio.run(call("/ssd/live/nope"))[0]["status"] == 404
    assert asyncio.run(call("/ssd/live/" + t2, b"n=x"))[0]["status"] == 200      # bad numbers: a full frame
    assert asyncio.run(call("/")) == ["passed"]


def test_plot_dicts_are_valid_plotly_figures():
    """The figures are plain dicts (cheap to build while streaming); plotly's own validator must accept them."""
    import json
    import random

    import plotly.graph_objects as go

    from app import plots
    from switchsd.core.events import StepEvent
    rng = random.Random(0)
    evs = []
    for i in range(30):
        acc = [1] * rng.randint(0, 3)
        evs.append(StepEvent(step=i, path=rng.choice(["copy", "neural"]), drafter=None, candidates=[], tree_tokens=[],
                             tree_parents=[], accepted_rows=[], accepted=acc, accepted_candidate=None, bonus=1,
                             new_tokens=acc + [1], position=i, probe_score=rng.random(), timings={"total": 0.01}))
    figs = [plots.accept_plot(evs), plots.probe_plot(evs, 0.4), plots.copy_rate_plot(evs),
            plots.toks_plot({"switchsd": plots.timeline(evs)}), plots.tok_per_fwd_plot({"a": evs, "b": evs[:5]}),
            plots.layer_plot([{"layer": 1, "sublayer": "attn", "auc": 0.9, "f1": 0.8},
                              {"layer": 2, "sublayer": "mlp", "auc": 0.95, "f1": 0.85}]),
            plots.accept_plot([]), plots.probe_plot([], 0.5), plots.copy_rate_plot([]), plots.toks_plot({})]
    for f in figs:
        go.Figure(f)                                      # raises on any unknown key or bad value
        value = plots.plot_value(f)
        assert value.type == "plotly" and json.loads(value.plot) == f
    acc = figs[0]
    assert {t["name"] for t in acc["data"]} == {"copy", "neural"}
    assert sum(len(t["x"]) for t in acc["data"]) == 30
    assert figs[1]["layout"]["shapes"][1]["y0"] == 0.4 and len(figs[1]["data"][1]["x"]) == \
        sum(e.path == "copy" for e in evs)


@pytest.mark.real
def test_api_verification_lab_labels_lossy_rules(server):
    from gradio_client import Client
    c = Client(server.url, verbose=False)
    view, bars, pos = c.predict("Tom has 7 apples and gets 5 more. How many?", "minp", 0.3, 0.7, 12,
                                api_name="/verify_lab")          # (the state output stays on the server)
    assert "LOSSY" in view and "minp:p_base=0.3" in view and 'class="tok' in view
    assert "position 0" in json.dumps(bars)
    view = c.predict("Say hello.", "lossless", 0.5, 0.7, 8, api_name="/verify_lab")[0]
    assert "lossless</b>: the output follows the target" in view
    with pytest.raises(Exception, match="l must be in"):
        c.predict("Say hello.", "lenience", 0.0, 0.7, 8, api_name="/verify_lab")
