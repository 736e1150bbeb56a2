"""Records and the pages built from them: a bench run's record round-trips and describes itself; `switchsd report`
rebuilds docs/results.md, the README's results and docs/scaling.md's vLLM block from the committed records, and
`--check` fails when a page and its records disagree. llama.cpp's server rows, driven through a stand-in server
(the client's protocol, EOS handling and counts), and the real one when `make llama-cpp` has built it."""
from __future__ import annotations

import gzip
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from switchsd.core.config import EngineConfig
from switchsd.eval import llama_server, records, report

ROOT = Path(__file__).resolve().parents[1]


def _run(tokens, wall=0.5, paths=None):
    return {"new_tokens": len(tokens), "steps": len(tokens), "wall_s": wall, "tok_s": len(tokens) / wall,
            "paths": paths or {"vanilla": {"steps": len(tokens), "accepted": 0, "drafted": 0, "zero": 0}}}


def _meta(**kw):
    return {"dataset": "humaneval", "date": "2026-12-06 00:00:00", "command": "python -m switchsd bench ...",
            "model": "tiny", "dtype": "float32", "device": "cpu", "n_prompts": 2, "budget": 8,
            "max_new_tokens": 4, "head_path": str(ROOT / "assets" / "eagle3-smollm2-135m"), "probe_path": None,
            "commit": {"sha": "abc", "dirty": False}, **kw}


def test_a_record_round_trips_and_its_figures_are_recomputed(tmp_path):
    runs = {"vanilla": [{"id": "a", "token_ids": [1, 2, 3], "stats": _run([1, 2, 3], 1.0)},
                        {"id": "b", "token_ids": [4, 5], "stats": _run([4, 5], 1.0)}],
            "copy": [{"id": "a", "token_ids": [1, 2, 3], "stats": _run([1, 2, 3], 0.5, {
                         "copy": {"steps": 1, "accepted": 2, "drafted": 2, "zero": 0}})},
                     {"id": "b", "token_ids": [4, 6], "stats": _run([4, 6], 0.5)}]}
    path = records.write_record(tmp_path / "r.json.gz", meta=_meta(), methods=["vanilla", "copy"], records=runs,
                                texts={"copy": {"a": "x y z"}}, mismatches=[])
    rec = records.read_record(path)
    assert rec["machine"]["cores"] == os.cpu_count() and rec["commit"] == {"sha": "abc", "dirty": False}
    assert rec["files"]["head"]["sha256"] and rec["runs"]["copy"][0]["text"] == "x y z"
    s = records.summarize(rec)
    assert s["copy"]["speedup"] == pytest.approx(2.0) and s["copy"]["identical"] == 1
    (tmp_path / "bad.json.gz").write_bytes(b"not gzip")
    with pytest.raises(ValueError, match="not a readable record"):
        records.read_record(tmp_path / "bad.json.gz")


def test_file_records_of_two_machines_get_a_section_each(tmp_path):
    """docs/records/files/MACHINE/: one section per machine folder, each with its own label and record paths; a
    machine's folder is named by its CPU and instruction set."""
    from switchsd.eval import files_page
    intel = {"cpu": "Intel(R) Xeon(R) Processor", "flags": ["avx2", "avx512f", "amx_tile"], "cores": 2, "l3": "491520K"}
    amd = {"cpu": "AMD EPYC 9B14 96-Core Processor", "flags": ["avx2", "avx512f"], "cores": 2, "l3": "32768K"}
    assert [records.machine_tag(m) for m in (intel, amd)] == ["intel-xeon-amx", "amd-epyc-avx512"]
    base = records.read_record(ROOT / "docs" / "records" / "files" / "intel-xeon-amx" / "curve-llama-3.2-1b.json.gz")
    for m in (intel, amd):
        folder = tmp_path / records.machine_tag(m)
        folder.mkdir()
        with gzip.open(folder / "curve-llama-3.2-1b.json.gz", "wt") as f:
            json.dump({**base, "machine": m}, f)
    machines = files_page.load_machines(tmp_path)
    assert [m.tag for m in machines] == ["amd-epyc-avx512", "intel-xeon-amx"]
    page = files_page.files_page(machines)
    for m in (intel, amd):
        assert f"### {records.machine_label(m)}" in page
        assert f"docs/records/files/{records.machine_tag(m)}/curve-llama-3.2-1b.json.gz" in page
    assert "No records yet: `make bench-files`." in page          # curves only: the files table says how to fill it


def test_the_committed_pages_match_their_records():
    r = subprocess.run([sys.executable, "-m", "switchsd", "report", "--check"], cwd=ROOT, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr


def test_the_check_fails_on_a_page_that_differs(tmp_path, monkeypatch):
    fake = tmp_path / "results.md"
    fake.write_text(report.results_page(report.load_records()).replace("Tok/s", "tok/s", 1))   # one edit by hand
    monkeypatch.setattr(report, "RESULTS", fake)
    with pytest.raises(SystemExit, match="results.md.* differ from what the records give"):
        report.main(["--check"])


# ------------------------------------------------------------------ llama.cpp's server, and a stand-in for it
FAKE = r'''#!{python}
"""A stand-in llama-server: /health, and /completion answering the prompt's last token + 1, 2, ... up to n_predict,
stopping at token 7 (its end of generation, which the real server leaves out of `tokens`)."""
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
port = int(sys.argv[sys.argv.index("--port") + 1])
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def _send(self, code, body):
        raw = json.dumps(body).encode(); self.send_response(code)
        self.send_header("Content-Length", str(len(raw))); self.end_headers(); self.wfile.write(raw)
    def do_GET(self): self._send(200, {{"status": "ok"}})
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert body["temperature"] == 0 and body["cache_prompt"] is False and body["return_tokens"]
        out, t = [], body["prompt"][-1]
        while len(out) < body["n_predict"]:
            t += 1
            if t == 7: break
            out.append(t)
        self._send(200, {{"tokens": out, "stop_type": "eos" if t == 7 else "limit",
                         "timings": {{"draft_n": 4, "draft_n_accepted": 2, "prompt_ms": 1.0, "predicted_ms": 2.0}}}})
HTTPServer(("127.0.0.1", port), H).serve_forever()
'''


@pytest.fixture
def fake_build(tmp_path):
    exe = tmp_path / "bin" / "llama-server"
    exe.parent.mkdir(parents=True)
    exe.write_text(FAKE.format(python=sys.executable))
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return tmp_path


def test_a_server_row_counts_its_tokens_eos_and_drafts(fake_build, monkeypatch, tmp_path):
    monkeypatch.setattr(llama_server, "build_dir", lambda: fake_build)
    cfg = EngineConfig(max_new_tokens=5)
    peer = llama_server.LlamaServerPeer("llama-cpp-ngram", tmp_path / "m.gguf", cfg, eos_ids=[7])
    try:
        assert "--spec-default" in peer.server.cmd
        g = peer.run([1, 2, 3])                    # 4 5 6, then the end of generation
        assert g.token_ids == [4, 5, 6, 7]         # the engine keeps the EOS token: so does the row
        assert g.stats["steps"] == 2 and g.stats["tok_per_fwd"] == 2.0        # 2 drafts accepted: 4 tokens, 2 forwards
        g = peer.run([0])                          # 1 2 3 4 5: cut at max_new_tokens
        assert g.token_ids == [1, 2, 3, 4, 5] and g.stats["wall_s"] > 0
    finally:
        peer.close()
    assert peer.server.proc.poll() is not None, "the server is stopped"
    with pytest.raises(ValueError, match="needs the EAGLE-3 head"):
        llama_server.LlamaServerPeer("llama-cpp-eagle3", tmp_path / "m.gguf", cfg, eos_ids=[7])


def test_a_server_that_dies_at_start_is_named(tmp_path, monkeypatch):
    exe = tmp_path / "bin" / "llama-server"
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\nkill -SEGV $$\n")
    exe.chmod(0o755)
    with pytest.raises(RuntimeError, match="killed by SIGSEGV at start"):
        llama_server.LlamaServer(tmp_path / "m.gguf", build=tmp_path)
    assert llama_server.self_test(tmp_path, tmp_path / "m.gguf") == 1
    assert "make llama-cpp" in llama_server.missing(tmp_path / "nowhere")


@pytest.mark.real
@pytest.mark.skipif(llama_server.missing() is not None, reason="llama.cpp is not built (make llama-cpp)")
def test_the_real_server_decodes_the_offline_model_greedily(real_lm):
    from switchsd.models.loading import gguf_path
    ids = real_lm.encode("Repeat exactly: alpha beta gamma delta", chat=True)
    peer = llama_server.LlamaServerPeer("llama-cpp", gguf_path(None), EngineConfig(max_new_tokens=12),
                                        real_lm.eos_ids())
    try:
        g = peer.run(ids)
    finally:
        peer.close()
    with torch.inference_mode():             # llama.cpp's arithmetic is not ours: its first token agrees
        first = int(real_lm.model(torch.tensor([ids])).logits[0, -1].argmax())
    assert g.token_ids[0] == first and 0 < len(g.token_ids) <= 12
    assert json.dumps(g.stats)


def test_a_vllm_pair_record_becomes_its_table(tmp_path):
    from switchsd.vllm.pair import write_pair_record
    rows = [{"suffix": {"s": 2.0, "tokens": 100, "text": "a"}, "switchsd": {"s": 1.0, "tokens": 100, "text": "a"}},
            {"suffix": {"s": 1.0, "tokens": 50, "text": "b"}, "switchsd": {"s": 1.0, "tokens": 50, "text": "c"}}]
    result = {"methods": ["suffix", "switchsd"], "max_new": 128, "k": None,
              "sets": {"humaneval": {"requests": rows}}, "counts": None}
    path = tmp_path / "vllm-pair.json.gz"
    write_pair_record(path, result, {"sha": "abc", "dirty": False}, "switchsd vllm pair --sets humaneval:2")
    rec = records.read_record(path)
    assert rec["kind"] == "vllm-pair" and rec["machine"]["cores"] == os.cpu_count()
    block = report.vllm_block([(path.name, rec)])
    # suffix: 150 tokens in 3 s = 50 tok/s; switchsd: 150 in 2 s = 75 tok/s; 1.5x; one text of two the same
    assert "| HumanEval 2 | 50.0 | 75.0 | 1.500x (" in block and "| 1/2 |" in block
    assert block.startswith(report.VLLM_BEGIN) and block.endswith(report.VLLM_END)
