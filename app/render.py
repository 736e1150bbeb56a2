"""HTML for the token views. Every piece of model text goes through html.escape; attributes are numbers or
fixed words. Nothing a user or the model writes can add markup or script to the page."""
from __future__ import annotations

import html
import weakref
from typing import Sequence

from switchsd.events import StepEvent

PATH_COLORS = {"copy": "#ffd8a8", "neural": "#b2f2bb", "vanilla": "#e9ecef", "oracle": "#d0bfff"}
PATH_NAMES = {"copy": "copied from the context", "neural": "drafted by the neural drafter",
              "vanilla": "plain step (no draft)", "oracle": "oracle draft"}

CSS = """
#live-plots{display:none}
.ssd-tokens{line-height:1.9;font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:14px}
.ssd-tokens .tok{white-space:pre-wrap;border-radius:3px;padding:1px 0;position:relative;
  border-bottom:3px solid transparent}
.ssd-tokens .tok.bonus{outline:1px solid #495057;outline-offset:-1px}
.ssd-tokens .tok.step-start{box-shadow:-2px 0 0 #868e96}
.ssd-tokens .tok .card{display:none;position:absolute;left:0;top:1.8em;z-index:20;min-width:240px;max-width:360px;
  background:#212529;color:#f8f9fa;padding:6px 8px;border-radius:6px;font-size:12px;white-space:normal;
  line-height:1.4;pointer-events:none}
.ssd-tokens .tok:hover .card{display:block}
.ssd-tokens .tok .card b{color:#fff}
.ssd-tokens .ctx{color:#495057}
.ssd-tokens .ctx.src-hi{background:#ffe066}
.ssd-legend span{padding:1px 6px;margin-right:6px;border-radius:3px;font-size:12px}
.ssd-lane{border:1px solid #dee2e6;border-radius:6px;padding:6px;margin-bottom:8px}
.ssd-badge{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px;margin-left:6px}
.ssd-badge.ok{background:#d3f9d8;color:#2b8a3e}.ssd-badge.bad{background:#ffe3e3;color:#c92a2a}
.ssd-strip .tok{display:inline-block;margin:1px 0}
.ssd-strip .lab{display:block;height:4px}
"""

# Hovering a copied token highlights its source span in the context (event delegation; no model text in JS).
HEAD_JS = """<script>
// Live frames: while a run streams, the page polls the run's live board (app/live.py) for new token spans, the
// figures' Plotly JSON and the status line. On a small machine the browser shares the cores with the model,
// and a Plotly redraw costs ~10 ms of CPU per plot however little changed (axes, legend, SVG), so live frames
// are drawn from the same JSON onto a canvas over each plot (~1 ms: bars, lines, markers, tau band, ticks, legend); the final figures arrive
// as interactive Plotly plots and the canvases go. With >= 8 cores (or ?live=plotly) live frames use
// Plotly.react in place instead (no resize). Plotly is global once the first gr.Plot has rendered.
(function(){
  var m = /[?&]live=(plotly|canvas)/.exec(location.search);
  var mode = m ? m[1] : ((navigator.hardwareConcurrency || 2) >= 8 ? 'plotly' : 'canvas');
  var PAL = ['#1f77b4', '#ff7f0e', '#2ca02c', '#d62728', '#9467bd', '#8c564b'];
  function ticks(lo, hi, n){
    var raw = (hi - lo) / n, p = Math.pow(10, Math.floor(Math.log10(raw))), e = raw / p;
    var step = (e >= 5 ? 10 : e >= 2 ? 5 : e >= 1 ? 2 : 1) * p, out = [];
    for (var v = Math.ceil(lo / step) * step; v <= hi + 1e-9; v += step) out.push(+v.toPrecision(6));
    return out;
  }
  function text(t){ return t == null ? '' : (typeof t === 'string' ? t : (t.text || '')); }
  function drawCanvas(gd, fig){
    var box = gd.parentElement, W = gd.offsetWidth, H = gd.offsetHeight;
    if (!W || !H) return;
    if (getComputedStyle(box).position === 'static') box.style.position = 'relative';
    var cv = box.querySelector(':scope > canvas.ssd-live');
    if (!cv) { cv = document.createElement('canvas'); cv.className = 'ssd-live'; box.appendChild(cv); }
    var r = window.devicePixelRatio || 1;
    cv.style.cssText = 'position:absolute;z-index:5;background:#fff;left:' + gd.offsetLeft + 'px;top:' +
      gd.offsetTop + 'px;width:' + W + 'px;height:' + H + 'px';
    if (cv.width !== Math.round(W * r) || cv.height !== Math.round(H * r)) { cv.width = Math.round(W * r); cv.height = Math.round(H * r); }
    var c = cv.getContext('2d'); c.setTransform(r, 0, 0, r, 0, 0); c.clearRect(0, 0, W, H);
    var L = fig.layout || {}, mg = L.margin || {}, data = fig.data || [];
    var l = (mg.l || 40) + 8, rt = mg.r || 10, t = mg.t || 36, b = (mg.b || 36) + 10, pw = W - l - rt, ph = H - t - b;
    var xs = [], ys = [0], bars = false;
    data.forEach(function(d){ (d.x || []).forEach(function(v){ xs.push(+v); }); (d.y || []).forEach(function(v){ ys.push(+v); });
                              if (d.type === 'bar') bars = true; });
    var x0 = xs.length ? Math.min.apply(null, xs) : 0, x1 = xs.length ? Math.max.apply(null, xs) : 1;
    if (bars) { x0 -= 0.5; x1 += 0.5; }
    if (x1 <= x0) x1 = x0 + 1;
    var yr = (L.yaxis || {}).range, y0 = yr ? yr[0] : Math.min.apply(null, ys), y1 = yr ? yr[1] : Math.max.apply(null, ys) * 1.05;
    if (y1 <= y0) y1 = y0 + 1;
    var X = function(v){ return l + (v - x0) / (x1 - x0) * pw; }, Y = function(v){ return t + ph - (v - y0) / (y1 - y0) * ph; };
    c.font = '11px sans-serif'; c.lineWidth = 1;
    c.fillStyle = '#444'; c.textAlign = 'right'; c.textBaseline = 'middle';
    ticks(y0, y1, 4).forEach(function(v){ c.strokeStyle = '#e9ecef'; c.beginPath(); c.moveTo(l, Y(v)); c.lineTo(l + pw, Y(v)); c.stroke();
                                          c.fillText(String(v), l - 4, Y(v)); });
    c.textAlign = 'center'; c.textBaseline = 'top';
    ticks(x0, x1, 6).forEach(function(v){ c.fillText(String(v), X(v), t + ph + 4); });
    (L.shapes || []).forEach(function(s){
      c.save(); c.globalAlpha = s.opacity == null ? 1 : s.opacity;
      if (s.type === 'rect') { c.fillStyle = s.fillcolor || '#ccc'; c.fillRect(l, Y(s.y1), pw, Y(s.y0) - Y(s.y1)); }
      else if (s.type === 'line') { c.strokeStyle = (s.line || {}).color || '#888'; c.setLineDash((s.line || {}).dash ? [5, 4] : []);
                                    c.beginPath(); c.moveTo(l, Y(s.y0)); c.lineTo(l + pw, Y(s.y1)); c.stroke(); }
      c.restore();
    });
    (L.annotations || []).forEach(function(a){ if (a.yref !== 'y') return; c.fillStyle = '#444'; c.textAlign = 'right';
      c.textBaseline = 'bottom'; c.fillText(text(a), l + pw, Y(a.y) - 2); });
    var bw = Math.max(1, 0.8 * pw / (x1 - x0)), legend = [];
    data.forEach(function(d, i){
      var mk = d.marker || {}, ln = d.line || {}, col = ln.color || mk.color || PAL[i % PAL.length];
      var x = d.x || [], y = d.y || [];
      if (d.type === 'bar') {
        c.fillStyle = mk.color || col; c.strokeStyle = (mk.line || {}).color || col;
        for (var j = 0; j < x.length; j++) { var h = Y(0) - Y(y[j]); c.fillRect(X(x[j]) - bw / 2, Y(y[j]), bw, h); if (bw > 3) c.strokeRect(X(x[j]) - bw / 2, Y(y[j]), bw, h); }
      } else {
        var md = d.mode || 'lines';
        if (md.indexOf('lines') >= 0 && x.length) {
          c.strokeStyle = col; c.lineWidth = 2; c.setLineDash(ln.dash === 'dot' ? [2, 3] : ln.dash === 'dash' ? [6, 4] : []);
          c.beginPath(); c.moveTo(X(x[0]), Y(y[0])); for (var j = 1; j < x.length; j++) c.lineTo(X(x[j]), Y(y[j])); c.stroke();
          c.setLineDash([]); c.lineWidth = 1;
        }
        if (md.indexOf('markers') >= 0) { c.fillStyle = mk.color || col;
          for (var j = 0; j < x.length; j++) { c.beginPath(); c.moveTo(X(x[j]), Y(y[j]) - 4); c.lineTo(X(x[j]) + 4, Y(y[j]) + 3); c.lineTo(X(x[j]) - 4, Y(y[j]) + 3); c.fill(); } }
      }
      if (d.name) legend.push([d.name, d.type === 'bar' ? (mk.color || col) : col]);
    });
    c.strokeStyle = '#adb5bd'; c.beginPath(); c.moveTo(l, t); c.lineTo(l, t + ph); c.lineTo(l + pw, t + ph); c.stroke();
    c.fillStyle = '#222'; c.textAlign = 'left'; c.textBaseline = 'alphabetic'; c.font = '13px sans-serif';
    c.fillText(text(L.title), 8, 20);
    c.font = '11px sans-serif'; c.fillStyle = '#444'; c.textAlign = 'right';
    c.fillText(text((L.xaxis || {}).title), l + pw, H - 10);
    var lx = l;
    legend.forEach(function(g){ c.fillStyle = g[1]; c.fillRect(lx, H - 20, 10, 8); c.fillStyle = '#444'; c.textAlign = 'left';
                                c.fillText(g[0], lx + 13, H - 12); lx += 24 + c.measureText(g[0]).width; });
    c.save(); c.translate(11, t + ph / 2); c.rotate(-Math.PI / 2); c.textAlign = 'center'; c.fillText(text((L.yaxis || {}).title), 0, 0); c.restore();
  }
  function draw(figs){
    Object.keys(figs).forEach(function(id){
      var gd = document.querySelector('#' + id + ' .js-plotly-plot');
      if (!gd) return;
      var fig = figs[id];
      if (mode === 'plotly' && window.Plotly) window.Plotly.react(gd, fig.data, fig.layout, {responsive: true, displaylogo: false});
      else drawCanvas(gd, fig);
      window.__ssdLiveFrames = (window.__ssdLiveFrames || 0) + 1;
    });
  }
  // app/live.py: the first Gradio frame names the run; then the board is polled for new token spans (appended
  // when the view still shows exactly the events the answer starts from), live figures and the status line,
  // until the run is done or the final Gradio frame clears the hidden element.
  var run = null;
  function poll(){
    var r = run; if (!r) return;
    var view = document.querySelector('#tokens-view .ssd-tokens');
    var have = view ? parseInt(view.getAttribute('data-n') || '0') : 0;
    fetch(new URL('ssd/live/' + encodeURIComponent(r.token) + '?n=' + have + '&v=' + r.v, location.href), {cache: 'no-store'})
      .then(function(x){ return x.ok ? x.json() : null; })
      .then(function(f){
        if (run !== r) return;                       // a newer run, or the final frame came first
        if (!f) { run = null; return; }
        var view = document.querySelector('#tokens-view .ssd-tokens');
        if (view && f.spans && parseInt(view.getAttribute('data-n') || '0') === f.from) {
          view.insertAdjacentHTML('beforeend', f.spans); view.setAttribute('data-n', f.n);
          window.__ssdTokenDeltas = (window.__ssdTokenDeltas || 0) + 1;
        }
        var st = document.querySelector('#status .ssd-status'); if (st && f.status) st.outerHTML = f.status;
        if (f.figs) { r.v = f.v; draw(f.figs); }
        if (f.done) run = null; else r.timer = setTimeout(poll, r.every);
      }).catch(function(){ if (run === r) r.timer = setTimeout(poll, r.every); });
  }
  function liveChanged(){
    var el = document.querySelector('#live-plots .ssd-run');
    if (!el) {                                       // the final frame: Plotly figures take over
      if (run) { clearTimeout(run.timer); run = null; }
      document.querySelectorAll('canvas.ssd-live').forEach(function(x){ x.remove(); });
      return;
    }
    var token = el.getAttribute('data-run');
    if (run && run.token === token) return;
    if (run) clearTimeout(run.timer);
    run = {token: token, every: parseInt(el.getAttribute('data-every')) || 500, v: 0};
    run.timer = setTimeout(poll, run.every);
  }
  window.__ssdLiveMode = mode;
  new MutationObserver(function(ms){
    for (var i = 0; i < ms.length; i++) {
      var t = ms[i].target;
      if (t.closest && t.closest('#live-plots')) { liveChanged(); return; }
    }
  }).observe(document.documentElement, {childList: true, subtree: true});
})();
document.addEventListener('mouseover', function(e){
  var t = e.target.closest && e.target.closest('.tok[data-src]');
  document.querySelectorAll('.src-hi').forEach(function(x){x.classList.remove('src-hi')});
  if(!t) return;
  var root = t.closest('.ssd-tokens'); if(!root) return;
  var s = parseInt(t.getAttribute('data-src')), n = parseInt(t.getAttribute('data-srclen') || '1');
  for (var i = s; i < s + n; i++) {
    var el = root.querySelector('[data-pos="' + i + '"]'); if (el) el.classList.add('src-hi');
  }
});
</script>"""


_TEXTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # tokenizer -> {id: text}


def token_text(tokenizer, tok: int) -> str:
    """Visible text of one token (empty tokens shown as ∅). Cached per tokenizer: every streamed frame
    re-renders all tokens so far."""
    try:
        texts = _TEXTS.setdefault(tokenizer, {})
    except TypeError:                      # not weak-referenceable: no cache
        texts = {}
    tok = int(tok)
    if tok not in texts:
        texts[tok] = tokenizer.decode([tok], skip_special_tokens=False) or "\u2205"
    return texts[tok]


def probe_bar(score: float | None, tau: float) -> str:
    """Underline colour: blue below tau, orange above; saturation grows with the distance from tau."""
    if score is None:
        return "transparent"
    d = max(-1.0, min(1.0, (score - tau) / max(tau, 1 - tau, 1e-6)))
    a = 0.25 + 0.75 * abs(d)
    return f"rgba(247,103,7,{a:.2f})" if d >= 0 else f"rgba(28,126,214,{a:.2f})"


def _card(e: StepEvent, is_bonus: bool, tau: float, tokenizer) -> str:
    lines = [f"<b>step {e.step}</b> · {html.escape(PATH_NAMES.get(e.path, e.path))}" if not is_bonus else
             f"<b>step {e.step}</b> · bonus token (the target's own choice)"]
    if e.probe_score is not None:
        rel = "≥" if e.probe_score >= tau else "<"
        lines.append(f"probe {e.probe_score:.3f} {rel} tau {tau:.2f}")
    if e.gate and "kgram_match" in e.gate:
        lines.append("kappa-gram seen earlier: " + ("yes" if e.gate["kgram_match"] else "no"))
    if e.gate and "arm" in e.gate:
        lines.append(f"bandit arm: {html.escape(str(e.gate['arm']))}")
    if e.match and e.match.get("sources"):
        lines.append(f"copied from position {int(e.match['sources'][0])}")
    lines.append(f"drafted {e.n_verified - 1} · accepted {len(e.accepted)} · {len(e.candidates)} candidate(s)")
    return "<br>".join(lines)


def _src_of(e: StepEvent, i: int) -> int | None:
    """Position in the full sequence that the i-th accepted copy token came from."""
    if e.path != "copy" or not e.match or e.accepted_candidate is None:
        return None
    sources = e.match.get("sources") or []
    return int(sources[e.accepted_candidate]) + i if e.accepted_candidate < len(sources) else None


def token_spans(tokenizer, events: Sequence[StepEvent], tau: float = 0.5) -> str:
    """One span per committed token (data-path / data-step / data-probe / data-pos, hover card)."""
    spans = []
    for e in events:
        n_acc = len(e.accepted)
        card = _card(e, False, tau, tokenizer)
        bonus_card = _card(e, True, tau, tokenizer)
        for i, tok in enumerate(e.new_tokens):
            is_bonus = i >= n_acc
            path = "bonus" if is_bonus else e.path
            bg = PATH_COLORS["vanilla"] if is_bonus else PATH_COLORS.get(e.path, "#e9ecef")
            cls = "tok" + (" bonus" if is_bonus else "") + (" step-start" if i == 0 else "")
            probe = "" if e.probe_score is None else f"{e.probe_score:.4f}"
            src = None if is_bonus else _src_of(e, i)
            src_attr = f' data-src="{src}" data-srclen="1"' if src is not None else ""
            spans.append(
                f'<span class="{cls}" style="background:{bg};border-bottom-color:{probe_bar(e.probe_score, tau)}"'
                f' data-path="{path}" data-step="{e.step}" data-probe="{probe}" data-pos="{e.position + i}"'
                f'{src_attr}>{html.escape(token_text(tokenizer, tok))}'
                f'<span class="card">{bonus_card if is_bonus else card}</span></span>')
    return "".join(spans)


def tokens_html(tokenizer, events: Sequence[StepEvent], tau: float = 0.5, prompt_ids: Sequence[int] = (),
                show_prompt: bool = True, elem_id: str = "tokens") -> str:
    """The generated text, one span per token with data-path / data-step / data-probe, hover cards, and the
    prompt (when shown) as the context a copied token's source span is highlighted in."""
    ctx = ""
    if show_prompt and prompt_ids:
        ctx = "".join(f'<span class="ctx" data-pos="{i}">{html.escape(token_text(tokenizer, t))}</span>'
                      for i, t in enumerate(prompt_ids))
        ctx = f'<details><summary>context ({len(prompt_ids)} tokens)</summary>{ctx}</details>'
    legend = "".join(f'<span style="background:{c}">{p}</span>' for p, c in PATH_COLORS.items() if p != "oracle")
    legend += ('<span style="outline:1px solid #495057">bonus</span>'
               '<span style="border-bottom:3px solid rgba(247,103,7,.9)">probe ≥ tau</span>'
               '<span style="border-bottom:3px solid rgba(28,126,214,.9)">probe &lt; tau</span>')
    # no <style> here: the page carries CSS once (re-sending it every frame re-styles the whole page)
    return (f'<div class="ssd-legend">{legend}</div>'
            f'<div class="ssd-tokens" id="{html.escape(elem_id)}" data-n="{len(events)}">{ctx}'
            f'{token_spans(tokenizer, events, tau)}</div>')


def lane_html(title: str, tokenizer, events: Sequence[StepEvent], lossless: bool | None, stats: str) -> str:
    badge = "" if lossless is None else (
        '<span class="ssd-badge ok">lossless ✓ equals vanilla</span>' if lossless else
        '<span class="ssd-badge bad">differs from vanilla</span>')
    return (f'<div class="ssd-lane" data-lane="{html.escape(title)}"><b>{html.escape(title)}</b>{badge}'
            f'<div style="font-size:12px;color:#495057">{html.escape(stats)}</div>'
            f'{tokens_html(tokenizer, events, show_prompt=False, elem_id="lane-" + title)}</div>')


def heat_strip(tokenizer, tokens: Sequence[int], scores: Sequence[float], labels: Sequence[bool], tau: float,
               title: str = "") -> str:
    """Per-token probe scores as background heat, with the n-gram copy label as a bar under each token."""
    spans = []
    for t, s, y in zip(tokens, scores, labels):
        a = max(0.0, min(1.0, float(s)))
        bg = f"rgba(247,103,7,{a:.2f})" if s >= tau else f"rgba(28,126,214,{0.15 + 0.5 * (1 - a):.2f})"
        lab = "#2b8a3e" if y else "transparent"
        spans.append(f'<span class="tok" data-probe="{float(s):.4f}" data-label="{int(bool(y))}" '
                     f'style="background:{bg}" title="probe {float(s):.3f} · label {"copy" if y else "no copy"}">'
                     f'{html.escape(token_text(tokenizer, t))}<span class="lab" style="background:{lab}"></span></span>')
    head = f"<b>{html.escape(title)}</b> " if title else ""
    return (f'<div class="ssd-tokens ssd-strip">{head}'
            f'<div style="font-size:12px;color:#495057">heat = probe score (orange: at or above tau={tau:.2f}); '
            f'green bar = verbatim copy label (n-gram)</div>{"".join(spans)}</div>')
