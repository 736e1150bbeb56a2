"""What the studio costs generation: click-to-first-token and streamed Tok/s in the app (headless Chromium,
real server, offline model) against the CLI engine on the same prompt and method.

    python scripts/app_overhead.py [--method switchsd] [--prompt TEXT] [--max-new-tokens 128] [--runs 3]

CLI: `python -m switchsd.generate --json` (fresh process per run, model load not counted): Tok/s from its
stats, first token = prefill + first step. App: the page is loaded once and one warm-up generation loads the
model (and Plotly.js in the page); then per run Generate is clicked and the page itself times (mutation
observers) the click, the first token span and the final "Done" status, whose Tok/s (tokens / wall time of the
handler, drawing and streaming included, browser on the same CPU) is read.
Medians are printed; the LAST line is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from app.studio import PRESETS  # noqa: E402
from test_browser import CHROMIUM, FLAGS  # noqa: E402
from app_server import AppServer  # noqa: E402


def cli_runs(method: str, prompt: str, max_new: int, runs: int) -> list[dict]:
    out = []
    for _ in range(runs):
        p = subprocess.run([sys.executable, "-m", "switchsd.generate", "--method", method, "--chat", "--prompt", prompt,
                            "--max-new-tokens", str(max_new), "--json"], cwd=ROOT, capture_output=True, text=True,
                           check=True)
        d = json.loads(p.stdout.strip().splitlines()[-1])
        first = d["steps"][0]["timings"]
        out.append({"tok_s": d["stats"]["tok_s"], "first_token_s": first.get("prefill", 0.0) + first["total"],
                    "tokens": d["stats"]["new_tokens"]})
    return out


WATCH = """() => {
  window.__t0 = null; window.__first = null; window.__done = null;
  const old = (document.querySelector('#tokens') || {}).innerHTML;   // the last run's tokens stay until replaced
  document.querySelector('#run').addEventListener('click', () => { window.__t0 = performance.now(); },
                                                  {capture: true, once: true});
  new MutationObserver((m, obs) => {
    const t = document.querySelector('#tokens');
    if (window.__t0 !== null && t && t.querySelector('.tok') && t.innerHTML !== old) {
      window.__first = performance.now(); obs.disconnect(); }
  }).observe(document.querySelector('#tokens-view'), {childList: true, subtree: true, characterData: true});
  let seen = false;     // the previous run's status says Done too: wait for a new status first
  new MutationObserver((m, obs) => {
    const t = document.querySelector('#status').innerText;
    if (!t.includes('Done')) seen = true;
    else if (seen && window.__t0 !== null) { window.__done = performance.now(); obs.disconnect(); }
  }).observe(document.querySelector('#status'), {childList: true, subtree: true, characterData: true});
}"""


def app_runs(method: str, prompt: str, runs: int) -> list[dict]:
    """One page load; run 0 warms up (model load, Plotly.js); then each run is timed in the page itself."""
    from playwright.sync_api import sync_playwright
    server = AppServer()
    out = []
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(server.url, wait_until="domcontentloaded", timeout=120_000)
            page.wait_for_selector("#run", timeout=120_000)
            page.wait_for_timeout(3000)                    # let the page finish its own start-up work
            page.locator("#prompt textarea").fill(prompt)
            if method:
                page.locator("#method input").fill(method)
                page.keyboard.press("Enter")
            for i in range(runs + 1):
                page.evaluate(WATCH)
                page.locator("#run").click()
                page.wait_for_function("window.__done !== null && window.__first !== null", timeout=600_000)
                first = page.evaluate("(window.__first - window.__t0) / 1000")
                status = page.locator("#status").inner_text()
                m = re.search(r"([\d.]+) tok/s", status)
                n = re.search(r"(\d+) tokens", status)
                if i:
                    out.append({"tok_s": float(m[1]), "first_token_s": first, "tokens": int(n[1])})
                page.wait_for_timeout(1000)
            browser.close()
    finally:
        server.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--method", default="switchsd")
    ap.add_argument("--prompt", default=PRESETS["Code rewrite (copy-heavy)"])
    ap.add_argument("--max-new-tokens", type=int, default=128, help="the app's default")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    cli = cli_runs(args.method, args.prompt, args.max_new_tokens, args.runs)
    app = app_runs(args.method, args.prompt, args.runs)
    med = lambda rs, k: statistics.median(r[k] for r in rs)
    res = {"method": args.method, "max_new_tokens": args.max_new_tokens, "runs": args.runs,
           "cli_tok_s": med(cli, "tok_s"), "app_tok_s": med(app, "tok_s"),
           "cli_first_token_s": med(cli, "first_token_s"), "app_click_to_first_token_s": med(app, "first_token_s"),
           "cli_tokens": [r["tokens"] for r in cli], "app_tokens": [r["tokens"] for r in app]}
    res["app_cost_pct"] = 100.0 * (1 - res["app_tok_s"] / res["cli_tok_s"])
    print(f"CLI: {res['cli_tok_s']:.2f} tok/s, first token {1000 * res['cli_first_token_s']:.0f} ms")
    print(f"app: {res['app_tok_s']:.2f} tok/s, click to first token {1000 * res['app_click_to_first_token_s']:.0f} ms")
    print(f"the app costs generation {res['app_cost_pct']:.1f}% of the CLI's Tok/s (medians of {args.runs})")
    print(json.dumps(res))


if __name__ == "__main__":
    main()
