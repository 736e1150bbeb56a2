"""What the studio costs generation: click-to-first-token and streamed Tok/s in the app (headless Chromium,
real server, offline model) against the CLI engine on the same prompt and method.

    python scripts/app_overhead.py [--method switchsd] [--prompt TEXT] [--max-new-tokens 128] [--runs 5]
        [--variant NAME:ENV=VALUE,...]

The runs are interleaved (CLI, app, CLI, app, ...) so that a drift in the machine's speed hits both alike.
CLI: `python -m switchsd generate --json` (fresh process per run, model load not counted), with the browser on
about:blank; Tok/s from its stats, first token = prefill + first step. App: the server keeps the model loaded;
before each timed run the page is reloaded and one untimed generation warms it up (Plotly.js); then Generate
is clicked and the page itself times (mutation observers) the click, the first token span and the final
"Done" status, whose Tok/s (tokens / wall time of the handler, drawing and streaming included, browser on the
same CPU) is read. Medians are printed; the LAST line is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from app_server import AppServer  # noqa: E402
from test_browser import CHROMIUM, FLAGS  # noqa: E402

from app.studio import PRESETS  # noqa: E402


def cli_run(method: str, prompt: str, max_new: int) -> dict:
    p = subprocess.run([sys.executable, "-m", "switchsd", "generate", "--method", method, "--chat", "--prompt", prompt,
                        "--max-new-tokens", str(max_new), "--json"], cwd=ROOT, capture_output=True, text=True,
                       check=True)
    d = json.loads(p.stdout.strip().splitlines()[-1])
    first = d["steps"][0]["timings"]
    return {"tok_s": d["stats"]["tok_s"], "first_token_s": first.get("prefill", 0.0) + first["total"],
            "tokens": d["stats"]["new_tokens"]}


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


class AppPage:
    """The real server and one headless Chromium page on it."""

    def __init__(self, pw, method: str, prompt: str):
        self.server = AppServer()
        self.browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        self.page = self.browser.new_page(viewport={"width": 1400, "height": 1000})
        self.method, self.prompt = method, prompt

    def _open(self) -> None:
        page = self.page
        page.goto(self.server.url, wait_until="domcontentloaded", timeout=120_000)
        page.wait_for_selector("#run", timeout=120_000)
        page.wait_for_timeout(2000)                    # let the page finish its own start-up work
        page.locator("#prompt textarea").fill(self.prompt)
        page.locator("#method input").fill(self.method)
        page.keyboard.press("Enter")

    def _click(self) -> dict:
        page = self.page
        page.evaluate(WATCH)
        page.locator("#run").click()
        page.wait_for_function("window.__done !== null && window.__first !== null", polling=250,
                               timeout=600_000)   # not "raf": 60 polls a second would load the CPU
        first = page.evaluate("(window.__first - window.__t0) / 1000")
        status = page.locator("#status").inner_text()
        return {"tok_s": float(re.search(r"([\d.]+) tok/s", status)[1]), "first_token_s": first,
                "tokens": int(re.search(r"(\d+) tokens", status)[1])}

    def run(self) -> dict:
        self._open()
        self._click()                                  # warm-up: model load (first time), Plotly.js
        self.page.wait_for_timeout(10_000)             # the page animates for ~8 s after a run (Svelte tweens)
        out = self._click()
        self.page.wait_for_timeout(500)
        self.page.goto("about:blank")                  # nothing of the app runs during the CLI's turn
        return out

    def close(self) -> None:
        self.browser.close()
        self.server.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--method", default="switchsd")
    ap.add_argument("--prompt", default=PRESETS["Copy: code rewrite"].prompt)
    ap.add_argument("--max-new-tokens", type=int, default=128, help="the app's default")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--variant", action="append", default=[], metavar="NAME:K=V[,K=V]",
                    help="also time a server started with these environment variables (e.g. "
                    "'noframes:SWITCHSD_REFRESH_S=1000,SWITCHSD_PLOT_REFRESH_S=1000'), in the same rounds")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright
    variants = {"app": {}}
    for v in args.variant:
        name, _, kv = v.partition(":")
        variants[name] = dict(x.split("=", 1) for x in kv.split(",") if x)
    cli, app = [], {name: [] for name in variants}
    with sync_playwright() as pw:
        pages = {}
        try:
            for name, env in variants.items():
                old = {k: os.environ.get(k) for k in env}
                os.environ.update(env)
                try:
                    pages[name] = AppPage(pw, args.method, args.prompt)
                finally:
                    for k, v in old.items():
                        os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
            for i in range(args.runs):
                cli.append(cli_run(args.method, args.prompt, args.max_new_tokens))
                for name, page in pages.items():
                    app[name].append(page.run())
                print(f"run {i + 1}: CLI {cli[-1]['tok_s']:.2f} tok/s, " +
                      ", ".join(f"{n} {app[n][-1]['tok_s']:.2f} tok/s" for n in pages), flush=True)
        finally:
            for page in pages.values():
                page.close()
    med = lambda rs, k: statistics.median(r[k] for r in rs)
    res = {"method": args.method, "max_new_tokens": args.max_new_tokens, "runs": args.runs,
           "cli_tok_s": med(cli, "tok_s"), "cli_first_token_s": med(cli, "first_token_s"),
           "cli_tokens": [r["tokens"] for r in cli], "variants": {n: e for n, e in variants.items() if e}}
    print(f"CLI: {res['cli_tok_s']:.2f} tok/s, first token {1000 * res['cli_first_token_s']:.0f} ms")
    for n, runs in app.items():
        pre = "" if n == "app" else f"{n}_"
        res[f"{pre}app_tok_s"] = med(runs, "tok_s")
        res[f"{pre}app_click_to_first_token_s"] = med(runs, "first_token_s")
        res[f"{pre}app_tokens"] = [r["tokens"] for r in runs]
        # paired: each app run against the CLI run of its round (robust to the machine's speed drifting)
        res[f"{pre}paired_ratios"] = ratios = [round(a["tok_s"] / c["tok_s"], 4) for a, c in zip(runs, cli)]
        res[f"{pre}app_cost_pct"] = cost = 100.0 * (1 - statistics.median(ratios))
        res[f"{pre}app_cost_pct_of_medians"] = cm = 100.0 * (1 - res[f"{pre}app_tok_s"] / res["cli_tok_s"])
        print(f"{n}: {res[f'{pre}app_tok_s']:.2f} tok/s, click to first token "
              f"{1000 * res[f'{pre}app_click_to_first_token_s']:.0f} ms; costs generation {cost:.1f}% of the CLI's "
              f"Tok/s (median of {args.runs} paired runs; ratio of the medians: {cm:.1f}%)")
    print(json.dumps(res))


if __name__ == "__main__":
    main()
