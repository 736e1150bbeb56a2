"""HTML for the token views. Every piece of model text goes through html.escape; attributes are numbers or
fixed words. Nothing a user or the model writes can add markup or script to the page."""
from __future__ import annotations

import html
import re
import weakref
from pathlib import Path
from typing import Sequence

from switchsd.core.events import StepEvent

PATH_COLORS = {"copy": "#ffd8a8", "neural": "#b2f2bb", "vanilla": "#e9ecef", "smc": "#c3fae8",
               "lookahead": "#d0ebff", "oracle": "#d0bfff"}
PATH_NAMES = {"copy": "copied from the context", "neural": "drafted by the neural drafter",
              "vanilla": "plain step (no draft)", "smc": "SMC-SD particle draft (kept, approximate)",
              "lookahead": "an n-gram of Lookahead's Jacobi window",
              "oracle": "oracle draft"}

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

# The page script: live frames (polling app/live.py), the canvas renderer, source-span highlighting on hover.
HEAD_JS = "<script>\n" + Path(__file__).with_name("page.js").read_text(encoding="utf-8") + "</script>"


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
    if e.gate and e.gate.get("mode") == "cost":     # why the cost gate ran what it ran
        g = e.gate
        what = {"plain": "a plain step", "copy": f"copy, {g['copy_depth']} deep",
                "neural": f"neural chain of {g['neural_depth']}",
                "lookup": f"prompt lookup, {g['copy_depth']} deep (a short repeat)",
                "copy+neural": f"copy ({g['copy_depth']} deep) + neural chain of {g['neural_depth']} in one forward"
                }.get(g.get("choice"), str(g.get("choice")))
        lines.append(f"cost gate: {html.escape(what)}" + (" (exploring)" if g.get("explore") else "") +
                     ("" if g.get("copy") else " · copying not plausible"))
        best = ", ".join(f"{html.escape(str(k))} {v:.0f}" for k, v in (g.get("expected_tok_s") or {}).items())
        lines.append(f"expected tok/s: {best}")
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


def lane_html(title: str, tokenizer, events: Sequence[StepEvent], lossless: bool | tuple[bool, str] | None,
              stats: str, paths: str = "", why: str = "") -> str:
    """`lossless`: None (no badge), a bool, or (equal, text) with the text the badge shows (escaped here)."""
    if isinstance(lossless, tuple):
        ok, text = lossless
    else:
        ok, text = lossless, "equal to vanilla" if lossless else "differs from vanilla"
    badge = "" if lossless is None else (
        f'<span class="ssd-badge ok">lossless ✓ {html.escape(text)}</span>' if ok else
        f'<span class="ssd-badge bad">{html.escape(text)}</span>')
    return (f'<div class="ssd-lane" data-lane="{html.escape(title)}"><b>{html.escape(title)}</b>{badge}'
            f'<div class="ssd-stats" style="font-size:12px;color:#495057">{html.escape(stats)}</div>'
            + (f'<div class="ssd-paths" style="font-size:12px;color:#495057">{html.escape(paths)}</div>' if paths else "")
            + (f'<div class="ssd-why" style="font-size:12px;color:#862e9c">{html.escape(why)}</div>' if why else "")
            + f'{tokens_html(tokenizer, events, show_prompt=False, elem_id="lane-" + re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-"))}</div>')


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
