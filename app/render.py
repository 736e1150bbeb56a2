"""Token view HTML. Every piece of model text is escaped; nothing from the model reaches the page raw."""
from __future__ import annotations

import html
from typing import Iterable

from switchsd.events import StepEvent

PATH_COLORS = {"copy": "#ffd8a8", "neural": "#b2f2bb", "vanilla": "#e9ecef"}

STYLE = """<style>
#tokens .tok{white-space:pre-wrap;border-radius:3px;padding:0 1px;margin:0;font-family:ui-monospace,monospace}
#tokens .tok.bonus{outline:1px solid #495057}
#tokens .tok.step-start{border-left:2px solid #868e96}
#tokens .legend span{padding:1px 6px;margin-right:6px;border-radius:3px}
</style>"""


def token_text(tokenizer, tok: int) -> str:
    """The visible text of one token (special tokens shown by name, whitespace made visible)."""
    text = tokenizer.decode([tok], skip_special_tokens=False)
    if text == "":
        return "\u2205"
    return text


def tokens_html(tokenizer, events: Iterable[StepEvent]) -> str:
    spans = []
    for e in events:
        n_acc = len(e.accepted)
        for i, tok in enumerate(e.new_tokens):
            is_bonus = i >= n_acc
            cls = "tok" + (" bonus" if is_bonus else "") + (" step-start" if i == 0 else "")
            bg = PATH_COLORS.get(e.path if not is_bonus else "vanilla", "#e9ecef")
            probe = "" if e.probe_score is None else f"{e.probe_score:.3f}"
            title = (f"step {e.step} · {'bonus (target)' if is_bonus else e.path + ' draft, accepted'}"
                     f" · drafted {e.n_verified - 1}, accepted {n_acc}")
            spans.append(
                f'<span class="{cls}" style="background:{bg}" data-path="{html.escape(e.path if not is_bonus else "bonus")}"'
                f' data-step="{e.step}" data-probe="{probe}" title="{html.escape(title)}">'
                f"{html.escape(token_text(tokenizer, tok))}</span>")
    legend = "".join(f'<span style="background:{c}">{p}</span>' for p, c in PATH_COLORS.items())
    return (f'{STYLE}<div id="tokens"><div class="legend">{legend}'
            f'<span style="outline:1px solid #495057">bonus</span></div><div>{"".join(spans)}</div></div>')
