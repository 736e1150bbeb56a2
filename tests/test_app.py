"""The studio through its API (gradio_client) and the HTML builder against hostile model text."""
from __future__ import annotations

import html
from pathlib import Path

import pytest

from app.render import heat_strip, tokens_html
from switchsd.events import StepEvent

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
    strip = heat_strip(FakeTok(), [0, 1, 2], [0.1, 0.6, 0.9], [False, True, True], 0.5)
    assert "<script>alert" not in strip and "&lt;script&gt;" in strip


@pytest.fixture(scope="module")
def server():
    from app_server import AppServer
    s = AppServer()
    yield s
    s.close()


@pytest.mark.real
def test_api_generation_streams_and_errors(server):
    from gradio_client import Client
    c = Client(server.url, verbose=False)
    args = ('Repeat this JSON exactly: {"a": 1, "b": "<script>x</script>", "c": [1, 2, 3]}', "copy", 0.0, 64, True,
            False, 0.5, 5, 10, 20, 0)
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
                   api_name="/generate")
    time.sleep(6)
    job.cancel()
    t0 = time.time()
    while not job.done() and time.time() - t0 < 30:
        time.sleep(0.5)
    outs = job.outputs()
    assert job.done()
    if outs and outs[-1] and outs[-1][1]:
        assert "1024 tokens" not in outs[-1][1], "cancelled before the end"


@pytest.mark.real
def test_api_race_returns_three_lossless_lanes(server):
    from gradio_client import Client
    from app.resources import Resources
    if Resources().default_method() != "switchsd":
        pytest.skip("the race needs the shipped EAGLE3 head and probe")
    c = Client(server.url, verbose=False)
    outs = list(c.submit("Repeat exactly: alpha beta gamma delta epsilon zeta eta theta iota kappa.", 24, True, False,
                         api_name="/race"))
    lanes, status = outs[-1][0], outs[-1][1]
    assert lanes.count('class="ssd-lane"') == 3
    for m in ("switchsd", "eagle3", "copyspec"):
        assert f'data-lane="{m}"' in lanes
    assert lanes.count("lossless ✓") == 3, "fp32, T=0: every lane equals vanilla"
    assert "replay" in status


@pytest.mark.real
def test_api_probe_lab_scores_and_rejects_bad_files(server, tmp_path):
    from gradio_client import Client
    from app.resources import Resources
    c = Client(server.url, verbose=False)
    shipped = Resources().shipped_probes()
    if shipped:
        view, _, tau = c.predict(shipped[0], "", None, "The cat sat on the mat. The cat sat on the mat.", False,
                                     api_name="/probe_lab")
        assert 'class="tok' in view and 0.0 < tau < 1.0
    for path, msg in [(str(ROOT / "tests" / "data" / "probe_heldout.jsonl"), "safetensors"),
                      (str(tmp_path / "missing.safetensors"), "does not exist")]:
        with pytest.raises(Exception, match=msg):
            c.predict(path, "", None, "some text", False, api_name="/probe_lab")


def test_live_plot_html_carries_escaped_figure_json():
    import json
    import re

    import plotly.graph_objects as go

    from app.plots import live_html
    fig = go.Figure(go.Scatter(x=[1, 2], y=[3, 4], name='"><script>alert(1)</script>'))
    out = live_html({"plot-accept": fig})
    assert "<script>" not in out and out.count('class="ssd-fig"') == 1
    m = re.fullmatch(r'<div class="ssd-fig" data-target="plot-accept" data-fig="([^"]*)"></div>', out)
    back = json.loads(html.unescape(m[1]))
    assert back["data"][0]["name"] == '"><script>alert(1)</script>' and back["data"][0]["y"] == [3, 4]
