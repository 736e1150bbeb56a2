"""The studio in headless Chromium (Playwright): generate the copy-heavy preset, see coloured token spans and
the live plots, run the race, open the probe lab. Screenshots go to $SWITCHSD_SCREENSHOTS (the README's
docs/img when refreshed) or tests/artifacts."""
from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", "--disable-quic"]

pytestmark = [pytest.mark.real, pytest.mark.browser,
              pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium (apt-get install chromium)")]


@pytest.fixture(scope="module")
def browser():
    """One Chromium for the file (Playwright's sync API allows one running instance per thread)."""
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def page(browser):
    from app_server import AppServer
    live = {"SWITCHSD_PLOT_REFRESH_S": "0.1", "SWITCHSD_REFRESH_S": "0.1",   # live frames even in a short run
            "SWITCHSD_FIRST_FRAME_S": "0"}
    os.environ.update(live)                                                   # (server env)
    try:
        server = AppServer()
    finally:
        for k in live:
            del os.environ[k]
    yield from studio_page(browser, server)


def studio_page(browser, server):
    """A page of `browser` on the studio `server` once its Generate button is there; page and server closed after."""
    try:
        pg = browser.new_page(viewport={"width": 1400, "height": 1000})
        pg.goto(server.url, wait_until="domcontentloaded", timeout=120_000)
        pg.wait_for_selector("#run", timeout=120_000)
        yield pg
        pg.close()
    finally:
        server.close()


README_SHOTS = {"generate", "race", "probe_lab", "step_inspector", "verification_lab"}   # what the README shows


def shot(page, name: str) -> None:
    out = Path(os.environ.get("SWITCHSD_SCREENSHOTS", ROOT / "tests" / "artifacts")) if name in README_SHOTS \
        else ROOT / "tests" / "artifacts"
    out.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(out / f"{name}.png"), full_page=True)


GIF_CLIP = {"x": 0, "y": 280, "width": 1400, "height": 720}     # prompt, status, tokens and the first plots


def gif(frames: list[bytes], name: str, width: int = 900) -> None:
    """PNG screenshots -> an animated GIF beside the screenshots (the last frame held)."""
    import io

    from PIL import Image
    assert frames, "no frames"
    out = Path(os.environ.get("SWITCHSD_SCREENSHOTS", ROOT / "tests" / "artifacts"))
    out.mkdir(parents=True, exist_ok=True)
    images = []
    step = max(1, len(frames) // 24)                 # at most ~25 frames: a GIF a README can carry
    frames = frames[:-1:step] + frames[-1:]
    for f in frames:
        im = Image.open(io.BytesIO(f)).convert("RGB")
        im = im.resize((width, round(im.height * width / im.width)), Image.LANCZOS)
        images.append(im.convert("P", palette=Image.ADAPTIVE, colors=128))
    durations = [250] * (len(images) - 1) + [3000]
    images[0].save(out / f"{name}.gif", save_all=True, append_images=images[1:], duration=durations, loop=0,
                   optimize=True)


def test_generate_copy_heavy_preset(page):
    page.locator("#prompt textarea").fill('Repeat this JSON exactly, then stop: {"name": "Alice", "age": 30, '
                                          '"city": "Paris", "skills": ["python", "sql", "statistics"], '
                                          '"address": {"street": "12 Rue de Rivoli", "zip": "75001"}, '
                                          '"projects": [{"title": "Weather dashboard", "year": 2021}, '
                                          '{"title": "Inventory tracker", "year": 2023}]}')
    # float32 (the exact-identity switch): slower than the bfloat16 default, so live frames arrive mid-run
    page.locator('#precision input[value="float32"]').check()
    page.locator("#run").click()
    frames = []                  # the README's GIF: the prompt, the tokens as they stream, the live plots
    t0 = time.time()
    while time.time() - t0 < 120 and "Done" not in page.locator("#status").inner_text():
        frames.append(page.screenshot(clip=GIF_CLIP))
        time.sleep(0.1)
    page.wait_for_selector('#tokens .tok[data-path="copy"]', timeout=120_000)
    page.wait_for_function("document.querySelector('#status').innerText.includes('tok/s')", timeout=120_000)
    for pid in ("plot-accept", "plot-copy-rate", "plot-toks"):     # the final figures, with this run's points
        page.wait_for_function(f"(() => {{ const g = document.querySelector('#{pid} .js-plotly-plot');"
                               "return !!g && g.data.some(t => (t.x || []).length > 0); })()", timeout=60_000)
    assert page.evaluate("window.__ssdLiveFrames || 0") > 0, "no live plot refresh while streaming"
    assert page.locator("#live-plots .ssd-fig").count() == 0, "live figures are cleared when the run ends"
    assert page.locator("canvas.ssd-live").count() == 0, "live canvases give way to the final Plotly figures"
    assert page.evaluate("window.__ssdTokenDeltas || 0") > 0, "no new tokens appended from the live board"
    assert "Done" in page.locator("#status .ssd-status").inner_text()
    spans = page.locator("#tokens .tok")
    assert spans.count() > 10
    first = spans.first
    assert first.get_attribute("data-step") is not None and first.get_attribute("data-path") is not None
    page.locator('#tokens .tok[data-path="copy"]').first.hover()
    shot(page, "generate")
    frames.append(page.screenshot(clip=GIF_CLIP))
    gif(frames, "generate")


LANE_STATS = re.compile(r"([\d.]+) tok/s(?: · ([\d.]+)x vanilla's ([\d.]+) tok/s in the same round)? · ([\d.]+) tok/fwd")


def test_race_speedups_hold(page):
    """Race in the default format: every lane is warmed up and the lanes take turns step by step, so a lane that drafted
    nothing (<= 1.02 tokens per forward) shows 0.95x-1.05x vanilla (a lane credited with a cold start or with
    another lane's slow steps would not); every lane lists its paths; EAGLE-3 says why its gate kept it plain."""
    from app.resources import Resources
    if Resources().default_method() != "switchsd":
        pytest.skip("the race needs the shipped EAGLE3 head and probe")
    # float32: what is tested is the race's timing, and float32's longer steps keep each lane's own per-step work
    # small beside them. In the 4-bit formats (q4q8 3-8 ms steps, int4 10-25 ms by CPU) the probe's, the gate's and
    # the feature recording's ~0.2-0.3 ms a step is a real 2-6%: SwitchSD and EAGLE-3 lanes that drafted nothing show
    # 0.94-0.97x on a quiet machine, at the band's edge, where the suite's other worker pushes them out.
    page.locator('#precision input[value="float32"]').check()
    page.get_by_role("tab", name="Race").click()
    page.locator("#race-prompt textarea").fill("Write a friendly email to a colleague thanking them for their help "
                                               "with the quarterly report.")
    for elem, value in (("#race-max-new", "64"), ("#race-repeats", "5")):   # ~40 s in all; 5 rounds
        box = page.locator(f"{elem} input[type=number]")
        box.fill(value)
        box.press("Enter")
    # the suite's other worker shares the two cores: a race whose rounds it hit unevenly is run again (at most
    # three races); the band must hold in one of them, the paths and the gate's sentence in every one
    for attempt in range(3):
        in_band = _race_once(page)
        if in_band:
            break
    assert in_band, "no race of three kept the lanes that drafted nothing within 0.95x-1.05x vanilla"


def _race_once(page) -> bool:
    page.locator("#race-run").click()
    page.wait_for_function("!document.querySelector('#race-status').innerText.includes('Done')", polling=500,
                           timeout=120_000)
    page.wait_for_function("document.querySelector('#race-status').innerText.includes('Done') && "
                           "document.querySelectorAll('#race-lanes .ssd-lane').length >= 4", polling=500,
                           timeout=420_000)
    shot(page, "race")
    lanes = page.evaluate("[...document.querySelectorAll('#race-lanes .ssd-lane')].map(l => ({name: l.dataset.lane, "
                          "stats: l.querySelector('.ssd-stats').innerText, "
                          "paths: (l.querySelector('.ssd-paths') || {}).innerText || '', "
                          "why: (l.querySelector('.ssd-why') || {}).innerText || ''}))")
    assert [x["name"] for x in lanes] == ["vanilla", "switchsd", "eagle3", "copyspec"], lanes
    print("race:", [(x["name"], x["stats"]) for x in lanes])      # shown when the test fails
    plain, ok = 0, True
    for lane in lanes:
        m = LANE_STATS.search(lane["stats"])
        assert m, lane
        assert lane["paths"].startswith("paths: ") and "% of steps" in lane["paths"], lane
        if lane["name"] != "vanilla":           # the line is one round: its tok/s over vanilla's = its speedup
            assert abs(float(m.group(1)) / float(m.group(3)) - float(m.group(2))) <= 0.01 + 0.06 / float(m.group(3)), lane
        if lane["name"] != "vanilla" and float(m.group(4)) <= 1.02:
            plain += 1
            ok = ok and 0.95 <= float(m.group(2)) <= 1.05
    assert plain >= 1, lanes                     # EAGLE-3's gated lane drafts ~nothing here: the check ran
    eagle = next(x for x in lanes if x["name"] == "eagle3")
    if float(LANE_STATS.search(eagle["stats"]).group(4)) <= 1.02:
        assert eagle["why"].startswith("Why plain: the cost gate drafted on"), eagle
    return ok


def test_probe_lab_opens(page):
    page.get_by_role("tab", name="Probe lab").click()
    page.wait_for_selector("#lab-run", timeout=30_000)
    from app.resources import Resources
    if Resources().shipped_probes():
        page.locator("#lab-run").click()
        page.wait_for_selector("#lab-view .ssd-strip .tok", timeout=120_000)
    shot(page, "probe_lab")


def test_step_inspector(page):
    """After the Generate run above: pick a step and see its candidate trie, gate and explanation."""
    page.get_by_role("tab", name="Step inspector").click()
    box = page.locator("#inspect-step input[type=number]")
    # it opens on the run's best drafted step (handlers.default_step): the JSON echo has accepted copies
    page.wait_for_function("(document.querySelector('#inspect-view .insp') || {}).innerText?.includes('accepted')",
                           timeout=30_000)
    opened = page.locator("#inspect-view").inner_text()
    m = re.search(r"Step (\d+) · path (\w+) · verified \d+ tokens in one target forward · accepted (\d+)", opened)
    assert m and m.group(2) in ("copy", "neural") and int(m.group(3)) >= 1, opened
    assert int(float(box.input_value())) == int(m.group(1)), "the slider shows the step the view opened on"
    # the run's last step bounds the slider (the cost gate may copy the whole JSON in a few steps)
    page.wait_for_function("Number(document.querySelector('#inspect-step input[type=number]').max) >= 1",
                           timeout=30_000)
    step = min(3, int(float(box.get_attribute("max"))))
    box.fill(str(step))
    box.press("Enter")
    page.wait_for_function("(document.querySelector('#inspect-view .insp') || {}).innerText?.includes("
                           f"'Step {step}')", timeout=30_000)
    assert "expected tok/s" in page.locator("#inspect-view").inner_text(), "the cost gate says why"
    shot(page, "step_inspector")


def test_stop_ends_the_run_with_what_was_written(page):
    """Stop mid-run: the engine stops at its next step and the view keeps the tokens written so far."""
    page.get_by_role("tab", name="Generate").click()
    page.locator("#prompt textarea").fill("Write a long story about a dragon who learns to bake bread.")
    page.locator("#run").click()
    page.wait_for_function("document.querySelector('#status').innerText.includes('Generating')", polling=250,
                           timeout=120_000)
    page.locator("#stop").click()
    page.wait_for_function("document.querySelector('#status').innerText.includes('Stopped')", polling=250,
                           timeout=60_000)
    assert page.locator("#tokens .tok").count() > 0
    assert page.locator("canvas.ssd-live").count() == 0


def test_verification_lab_click_a_token(page):
    """Run a lossy rule, see the LOSSY badge, click a token: the bars move to that position."""
    page.get_by_role("tab", name="Verification lab").click()
    page.wait_for_selector("#vl-run", timeout=30_000)
    page.locator("#vl-run").click()
    page.wait_for_selector("#vl-view .tok[data-pos]", timeout=180_000)
    assert "LOSSY" in page.locator("#vl-view").inner_text()
    toks = page.locator("#vl-view .tok[data-pos]")
    pos = min(5, toks.count() - 1)
    assert pos > 0
    toks.nth(pos).click()
    page.wait_for_function("(document.querySelector('#vl-bars') || {}).innerText?.includes("
                           f"'position {pos}')", timeout=30_000)
    shot(page, "verification_lab")


def test_serving_view_runs_sd_and_psd(page):
    """The Serving tab: a small load under SD and PSD (a real drafter process); the timeline shows both
    processes' lanes and every request finishes under both modes."""
    page.get_by_role("tab", name="Serving").click()
    page.wait_for_selector("#sv-run", timeout=30_000)
    page.locator("#sv-requests input[type=number]").fill("2")
    page.locator("#sv-requests input[type=number]").press("Enter")
    page.locator("#sv-max-new input[type=number]").fill("8")
    page.locator("#sv-max-new input[type=number]").press("Enter")
    page.locator("#sv-run").click()
    # 'Done', or an error toast (a failure shows its message at once instead of a 5-minute timeout)
    page.wait_for_function("(document.querySelector('#sv-summary') || {}).innerText?.includes('Done') || "
                           "document.body.innerText.includes('serving failed')", timeout=300_000)
    assert "serving failed" not in page.locator("body").inner_text(), page.locator("body").inner_text()[-600:]
    text = page.locator("#sv-summary").inner_text()
    assert text.count("2/2") == 2, text
    gantt = page.locator("#sv-gantt").inner_text()
    assert "PSD (draft and verify overlap) · drafter" in gantt and "SD (draft, then verify) · target" in gantt
    shot(page, "serving")


@pytest.mark.parametrize("name", ["Copy: JSON echo", "Math: accidental repetition"])
def test_preset_shows_its_regime(page, name):
    """Pick a preset: its prompt and regime note appear; generating (SwitchSD, float32) shows the regime's path:
    the JSON echo commits most of its tokens from copies; on the math prompt, whose short repeats prompt lookup
    drafts on most steps, the probe keeps the copy path to a few steps."""
    from app.resources import Resources
    from app.studio import PRESETS
    if Resources().default_method() != "switchsd":
        pytest.skip("the regimes need the shipped probe")
    page.get_by_role("tab", name="Generate").click()
    page.locator("#preset input").click()
    page.get_by_role("option", name=name).click()
    page.wait_for_function(f"document.querySelector('#prompt textarea').value === {PRESETS[name].prompt!r}",
                           timeout=30_000)
    assert PRESETS[name].regime[:40] in page.locator("#preset-regime").inner_text()
    page.locator('#precision input[value="float32"]').check()
    page.locator("#run").click()
    # the previous run's "Done" line stays until this run's first frame ("Starting…", then "Generating…")
    page.wait_for_function("!document.querySelector('#status').innerText.includes('Done')", polling=50,
                           timeout=60_000)
    page.wait_for_function("document.querySelector('#status').innerText.includes('Done')", polling=250,
                           timeout=180_000)
    status = page.locator("#status").inner_text()
    paths = page.evaluate("[...document.querySelectorAll('#tokens .tok')].map(t => t.dataset.path)")
    if name.startswith("Copy"):
        assert paths.count("copy") > len(paths) / 2, (paths, status)
    else:
        assert "% of steps" in status, status                # the status line lists the paths
        m = re.search(r"copy (\d+)% of steps", status)
        assert (int(m.group(1)) if m else 0) < 25, status    # no copy path listed: 0% of steps
    shot(page, "preset_" + name.split(":")[0].lower())


# -- the studio on a user's own GGUF file (a tiny random Qwen3, written as llama.cpp's converter lays one out,
# with the offline model's tokenizer): the header names the file's format, tokens stream coloured by path, and a
# probe trained in the Probe lab is the probe of the next Generate run. In this file (last), not its own: two
# studios on two workers at once, one of them training a probe, thrash the two cores the race is timed on.

@pytest.fixture(scope="module")
def gguf_page(browser, tmp_path_factory):
    from app_server import AppServer
    from families import tiny_folder
    from gguf_files import write_gguf
    from transformers import AutoModelForCausalLM
    out = tmp_path_factory.mktemp("qwen3-gguf")
    folder, head, _ = tiny_folder("qwen3", out)
    gguf = write_gguf(AutoModelForCausalLM.from_pretrained(folder), out / "qwen3-tiny-Q4_K_M-like.gguf")
    yield from studio_page(browser, AppServer("--model", str(gguf), "--eagle", str(head)))


def _generate(page) -> str:
    page.get_by_role("tab", name="Generate").click()
    page.locator("#prompt textarea").fill("Repeat exactly: the quick brown fox jumps over the lazy dog. "
                                          "The quick brown fox jumps over the lazy dog.")
    page.locator("#run").click()
    # a previous run's "Done" line stays until this run's first frame
    page.wait_for_function("!document.querySelector('#status').innerText.includes('Done')", polling=50,
                           timeout=60_000)
    page.wait_for_function("(s => s.includes('Done') || s.includes('rror'))(document.querySelector('#status')"
                           ".innerText)", polling=250, timeout=180_000)
    assert "Done" in page.locator("#status").inner_text(), page.locator("#status").inner_text()
    page.wait_for_function("document.querySelector('#model-status').innerText.includes('format')", polling=250,
                           timeout=60_000)                  # the header, updated after the run
    return page.locator("#model-status").inner_text()


def test_the_studio_runs_a_users_gguf_and_a_probe_trained_in_the_lab(gguf_page):
    page = gguf_page
    header = _generate(page)
    assert "qwen3-tiny-Q4_K_M-like.gguf" in header and "format q4q8" in header, header
    assert "probe none" in header                        # no shipped probe carries this model's fingerprint
    spans = page.locator("#tokens .tok")
    assert spans.count() > 5 and spans.first.get_attribute("data-path") is not None
    page.get_by_role("tab", name="Probe lab").click()
    page.locator("#lab-train").click()
    page.wait_for_function("document.querySelector('#lab-trained').innerText.includes('trained here')",
                           polling=500, timeout=600_000)
    assert "validation AUC" in page.locator("#lab-trained").inner_text()
    shot(page, "gguf_probe_trained")
    page.get_by_role("tab", name="Generate").click()
    page.locator("#method input").click()
    page.get_by_role("option", name="switchsd", exact=True).click()
    assert page.locator("#method input").input_value() == "switchsd"
    _generate(page)
    page.wait_for_function("!document.querySelector('#model-status').innerText.includes('(loads on first use) · "
                           "EAGLE')", polling=250, timeout=60_000)     # the run loaded the trained probe
    header = page.locator("#model-status").inner_text()
    assert "probe probe.safetensors" in header, header
    assert page.locator("#tokens .tok").count() > 5
    shot(page, "gguf_generate_with_trained_probe")
