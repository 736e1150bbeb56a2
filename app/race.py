"""The Race tab's handler: several methods on one prompt, timed alike by switchsd.eval.race (a warm-up of every
lane, then rounds in which the lanes take turns of a few steps each on the torch thread, each lane's median run), then replayed on
a common clock. Each lane says its speedup over vanilla, its paths, why a cost gate kept it plain, and whether
its text equals vanilla's."""
from __future__ import annotations

import html
import time
from typing import Any, Iterator, NamedTuple

import gradio as gr

from switchsd import envs
from switchsd.core.config import TreeConfig
from switchsd.eval.race import TURN, LaneResult, LaneSpec, RaceResult, plain_share
from switchsd.eval.race import race as race_lanes
from switchsd.eval.race import timeline as race_timeline

from . import plots
from .handlers import check_max_new, check_prompt
from .resources import Resources, UserError


class RaceFrame(NamedTuple):
    """One update of the Race tab."""
    lanes: Any
    status: Any
    toks_plot: Any
    tok_per_fwd_plot: Any


RACE_LANES = (LaneSpec("vanilla", "vanilla"), LaneSpec("switchsd", "switchsd"), LaneSpec("eagle3", "eagle3"),
              LaneSpec("copyspec", "copyspec"))
# EAGLE-3's own dynamic tree on every step (the drafter CopySpec falls back to): what the head does when no cost
# gate holds it back, and what that costs on this device
_T = TreeConfig()
NO_GATE = LaneSpec("eagle3 (no cost gate)", f"eagle3@tree{_T.top_k}x{_T.depth}x{_T.total_tokens}")
RACE_REPEATS = 3
# Pause between a progress frame and the next timed run, so that Gradio's sending of the frame (on its event
# loop) and the page's redraw happen before the run's clock starts rather than during it.
SETTLE_S = envs.get("SWITCHSD_RACE_SETTLE_S")


def race(res: Resources, prompt: str, max_new: int, chat: bool, with_vanilla: bool = True, replay_speed: float = 4.0,
         dtype: str = "auto", repeats: int = RACE_REPEATS, no_gate: bool = False) -> Iterator[RaceFrame]:
    """Vanilla vs SwitchSD vs EAGLE3 vs CopySpec (and, on request, EAGLE3 without its cost gate) on one prompt,
    timed alike (switchsd.eval.race: a warm-up first, then `repeats` rounds in which the lanes take turns of 8 steps
    each on the torch thread, each lane's clock counting its own steps; each lane's median run), then replayed on
    a common clock. Each lane shows its speedup over
    vanilla, its paths, why a cost gate kept it plain, and whether its text equals vanilla's; where it does not
    (bfloat16 near-ties), the badge names the first differing token and its float32 logit margin."""
    try:
        ids = check_prompt(res, prompt, chat)
        max_new = check_max_new(max_new)
        repeats = check_repeats(repeats)
        lm = res.lm(dtype)
    except UserError as e:
        raise gr.Error(str(e))
    except Exception as e:
        raise gr.Error(f"{e.__class__.__name__}: {e}")
    lanes = RACE_LANES + ((NO_GATE,) if no_gate else ())
    skipped: dict[str, str] = {}

    def build(spec: LaneSpec, n: int):       # built just before its run, closed right after (no hooks leak)
        return res.engine(spec.method, n, dtype=dtype)

    def skip(spec: LaneSpec, e: Exception) -> bool:  # e.g. no probe or head for this model: the others still race
        if isinstance(e, UserError):
            skipped[spec.name] = str(e)
            return True
        return False

    def skipped_note() -> str:
        return "".join(f" · {k} skipped: {html.escape(v)}" for k, v in skipped.items())

    result = None
    try:
        for item in race_lanes(build, lanes, ids, max_new, repeats=repeats, run=res.worker.call, skip=skip):
            if isinstance(item, RaceResult):
                result = item
            else:
                yield RaceFrame("<i>racing: the lanes appear once every round has run</i>",
                                html.escape(item) + skipped_note(), gr.skip(), gr.skip())
                time.sleep(SETTLE_S)     # let the server send this frame and the page draw it before the next run
    except UserError as e:
        raise gr.Error(str(e))
    runs = {m: lane.shown for m, lane in result.lanes.items()}
    ref = runs["vanilla"].token_ids
    res.remember_vanilla((lm.precision, tuple(ids), max_new), ref, result.lanes["vanilla"].tok_s)
    why = {}
    if any(g.token_ids != ref for g in runs.values()):       # explain each difference in float32
        from switchsd.eval.mismatch import explain
        f32 = res.lm("float32").model
        for m, g in runs.items():
            if g.token_ids != ref:
                why[m] = res.worker.call(explain, f32, ids, ref, g.token_ids)
    ref = (ref, why)
    clocks = {m: race_timeline(g) for m, g in runs.items()}
    end = max(ts[-1] for ts, _ in clocks.values() if ts)
    how = (f"lanes took turns of {TURN} steps each, each lane's clock counting its own steps, after a warm-up"
           + (f"; vanilla shows its median of {repeats} rounds, every other lane the round of its median ratio to "
              "vanilla in the same round (its tok/s, speedup and vanilla's tok/s on its line are that round's)"
              if repeats > 1 else ""))
    t, step = 0.0, end / 40
    while True:
        t = min(end, t + step)
        cut = {m: sum(1 for x in clocks[m][0] if x <= t) for m in runs}
        msg = (f"Done · replayed on a common clock ({end:.2f} s) · {how}{skipped_note()}" if t >= end else
               f"replay at {t:.2f} s of {end:.2f} s (common clock){skipped_note()}")
        yield _race_frame(lm, result, cut, with_vanilla, msg, ref, clocks)
        if t >= end:
            break
        time.sleep(step / replay_speed)


def check_repeats(n) -> int:
    try:
        n = int(n)
    except (TypeError, ValueError):
        raise UserError("Repeats must be a whole number.") from None
    if not 1 <= n <= 9:
        raise UserError("Repeats must be between 1 and 9.")
    return n


def gate_sentence(lane: LaneResult) -> str:
    """For a lane whose cost gate kept it plain on most steps: why, with the numbers the gate decided by."""
    o, g = lane.gate, lane.shown
    if not o or plain_share(g.events) < 0.5:
        return ""
    best = o["best"]
    return (f"Why plain: the cost gate drafted on {100 * (1 - plain_share(g.events)):.0f}% of steps. From the "
            f"head's recent acceptance (first token {100 * o['p_first']:.0f}%), its best chain ({best['gamma']} "
            f"token{'s' if best['gamma'] > 1 else ''}) would commit {best['expected_tokens']:.2f} tokens per step, "
            f"but on this device such a step costs as much as {best['break_even_tokens']:.2f} plain steps "
            f"(verifying 2 rows = {o['verify_ratio_2']:.2f}x one row of {o['verify_ms_1']:.1f} ms, plus the head's "
            f"{o['head_ms_1']:.1f} ms per token"
            + (f", and the {100 * o['margin']:.0f}% a neural draft must clear" if o.get("margin") else "")
            + "), so drafting would not pay here.")


def _paths_line(g) -> str:
    return "paths: " + ", ".join(f"{k} {v['pct']:.0f}% of steps" + (f" (mean accepted {v['mal']:.2f})"
                                                                     if k != "vanilla" else "")
                                 for k, v in g.stats["paths"].items())


def _badge(lm, out: list[int], ref: list[int], why: dict | None) -> tuple[bool, str]:
    """(equal, text) for a lane's lossless badge."""
    if out == ref:
        return True, "equal to vanilla"
    dt = lm.precision
    if not why:
        return False, f"differs from vanilla ({dt})"
    if why.get("kind") == "length":
        return False, f"differs from vanilla ({dt}): stops at {why['other_len']} tokens vs {why['vanilla_len']}"
    tok = lambda t: repr(lm.tokenizer.decode([t]))                       # noqa: E731
    return False, (f"differs from vanilla at token {why['position']}: {tok(why['other_token'])} vs "
                   f"{tok(why['vanilla_token'])}, float32 logit margin {abs(why['fp32_margin']):.3f} "
                   f"(a {dt} near-tie; run in float32 for identity)")


def _race_frame(lm, result: RaceResult, cut, with_vanilla, status, ref, clocks) -> RaceFrame:
    from .render import lane_html
    lanes = []
    shown = {m: lane for m, lane in result.lanes.items() if with_vanilla or m != "vanilla"}
    for m, lane in shown.items():
        g = lane.shown
        evs = g.events[:cut.get(m, len(g.events))]
        badge = None if ref is None or m == "vanilla" else _badge(lm, g.token_ids, ref[0], ref[1].get(m))
        speed = (f" · {result.speedup(m):.2f}x vanilla's {result.reference_tok_s(m):.1f} tok/s in the same round"
                 if m != result.reference else "")
        runs = " / ".join(f"{x.stats['tok_s']:.1f}" for x in lane.runs)
        stats = (f"{g.stats['new_tokens']} tokens in {g.stats['wall_s']:.2f} s · {g.stats['tok_s']:.1f} tok/s{speed} · "
                 f"{g.stats['tok_per_fwd']:.2f} tok/fwd" + (f" · runs {runs} tok/s" if len(lane.runs) > 1 else ""))
        lanes.append(lane_html(m, lm.tokenizer, evs, badge, stats, _paths_line(g), gate_sentence(lane)))
    lanes_ev = {m: lane.shown.events[:cut.get(m, len(lane.shown.events))] for m, lane in shown.items()}
    return RaceFrame("".join(lanes) or "<i>no lanes yet</i>", status,
                     plots.plot_value(plots.toks_plot({m: clocks[m] for m in shown})),
                     plots.plot_value(plots.tok_per_fwd_plot(lanes_ev)))
