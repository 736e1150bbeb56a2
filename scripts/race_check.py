"""Does the studio's race tell the truth? Races in one app process (headless Chromium, the real server, the
default format), then `switchsd bench` on the same prompts and methods, on the same machine:

    python scripts/race_check.py [--races 3] [--max-new-tokens 96] [--prompts email,presets]

Per prompt and lane: the races' Tok/s and speedups over vanilla, tokens per forward, and the bench's Tok/s for
the same method, measured right before and right after that prompt's races; a lane that drafted nothing (<= 1.02 tokens per forward) should show 0.95x-1.05x vanilla, and
every lane's Tok/s should lie within 10% of the bench's. Prints a Markdown table; the LAST line is JSON.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from app_server import AppServer  # noqa: E402
from test_browser import CHROMIUM, FLAGS  # noqa: E402

from app.studio import PRESETS  # noqa: E402

EMAIL = "Write a friendly email to a colleague thanking them for their help with the quarterly report."
METHODS = ("vanilla", "switchsd", "eagle3", "copyspec")
LANE = re.compile(r"([\d.]+) tok/s(?: · ([\d.]+)x vanilla)? · ([\d.]+) tok/fwd")


def race_once(page, prompt: str, max_new: int) -> dict:
    page.locator("#race-prompt textarea").fill(prompt)
    box = page.locator("#race-max-new input[type=number]")
    box.fill(str(max_new))
    box.press("Enter")
    page.locator("#race-run").click()
    # polled twice a second: Playwright's default polls on every animation frame, which keeps Chromium busy on
    # the two cores the model runs on (and slowed every lane by ~10-30% in this script's first version)
    page.wait_for_function("!document.querySelector('#race-status').innerText.includes('Done')", polling=500,
                           timeout=120_000)
    page.wait_for_function("document.querySelector('#race-status').innerText.includes('Done')", polling=500,
                           timeout=900_000)
    out = {}
    for lane in page.locator("#race-lanes .ssd-lane").all():
        name = lane.get_attribute("data-lane")
        m = LANE.search(lane.inner_text())
        out[name] = {"tok_s": float(m[1]), "speedup": float(m[2] or 1.0), "tok_per_fwd": float(m[3])}
    return out


def bench(prompts: dict[str, str], max_new: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "prompts.jsonl"
        data.write_text("".join(json.dumps({"id": k, "prompt": v}) + "\n" for k, v in prompts.items()))
        subprocess.run([sys.executable, "-m", "switchsd", "bench", "--dataset", "jsonl", "--data-file", str(data),
                            "--methods", ",".join(METHODS), "--max-new-tokens", str(max_new), "--out", tmp,
                            "--fresh"], cwd=ROOT, capture_output=True, text=True, check=True)
        res = json.loads((Path(tmp) / "results.json").read_text())
    return {m: {r["id"]: r["stats"]["tok_s"] for r in recs} for m, recs in res["records"].items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--races", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--prompts", default="email,presets")
    args = ap.parse_args()
    prompts = {}
    if "email" in args.prompts:
        prompts["email"] = EMAIL
    if "presets" in args.prompts:
        prompts.update({k: p.prompt for k, p in PRESETS.items()})
    from playwright.sync_api import sync_playwright
    server = AppServer()
    races: dict[str, list[dict]] = {k: [] for k in prompts}
    benches: dict[str, list[dict]] = {k: [] for k in prompts}
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(server.url, wait_until="domcontentloaded", timeout=120_000)
            page.wait_for_selector("#run", timeout=120_000)
            page.get_by_role("tab", name="Race").click()
            for name, prompt in prompts.items():
                # the bench right before and right after this prompt's races (the app idle meanwhile): the
                # machine's speed drifts by 10-30% within minutes, so only measurements close in time compare
                benches[name].append(bench({name: prompt}, args.max_new_tokens))
                for i in range(args.races):
                    races[name].append(race_once(page, prompt, args.max_new_tokens))
                    print(name, i + 1, races[name][-1], file=sys.stderr, flush=True)
                benches[name].append(bench({name: prompt}, args.max_new_tokens))
            header = page.locator("#model-status").inner_text()
            browser.close()
    finally:
        server.close()
    rows = ["| prompt | lane | race Tok/s | race speedup | tok/fwd | bench Tok/s (before / after) | race / bench |",
            "|---|---|---|---|---|---|---|"]
    summary = {}
    for name in prompts:
        for m in METHODS:
            rs = [r[m] for r in races[name] if m in r]
            if not rs:
                continue
            med = statistics.median(r["tok_s"] for r in rs)
            bs = [b[m][name] for b in benches[name]]
            b = statistics.mean(bs)
            summary[f"{name}/{m}"] = {"race_tok_s": [r["tok_s"] for r in rs], "speedup": [r["speedup"] for r in rs],
                                      "tok_per_fwd": rs[0]["tok_per_fwd"], "bench_tok_s": bs, "race_over_bench": med / b}
            toks = " / ".join(f"{r['tok_s']:.1f}" for r in rs)
            ups = " / ".join(f"{r['speedup']:.2f}x" for r in rs)
            rows.append(f"| {name} | {m} | {toks} | {ups} | {rs[0]['tok_per_fwd']:.2f} | "
                        f"{' / '.join(f'{x:.1f}' for x in bs)} | {med / b:.2f} |")
    print(f"header after the races: {header}\n")
    print("\n".join(rows))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
