"""GGUF files of a model as users download them: llama.cpp's own `convert_hf_to_gguf.py` (f16) and `llama-quantize`.

    python -m switchsd.eval.ggufs                       # the offline model as Q4_K_M, Q5_K_M, Q6_K, Q8_0, f16
    python -m switchsd.eval.ggufs --folder DIR --types Q4_K_M --out DIR

Needs `make llama-cpp` (the converter and the quantiser come from its source tree and build). Files are cached under
`<cache>/ggufs/<name>/` and made once.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from ..models.loading import cache_dir, default_model_folder
from .llama_server import build_dir, llama_cpp_home, missing

TYPES = ("Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "f16")


def _run(cmd: list[str], env: dict | None = None) -> None:
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if res.returncode:
        tail = "\n".join((res.stdout + res.stderr).strip().splitlines()[-6:])
        raise RuntimeError(f"{Path(cmd[1] if cmd[0] == sys.executable else cmd[0]).name} failed:\n{tail}")


def convert(folder: Path, out: Path) -> Path:
    """folder (a transformers checkpoint) -> out, an f16 GGUF by llama.cpp's converter (architectures added to the
    config when the folder's lacks them, as the offline model's does)."""
    if out.exists():
        return out
    src = llama_cpp_home() / "src"
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "model"
        model.mkdir()
        for f in folder.iterdir():
            if f.name != "config.json":
                os.symlink(f.resolve(), model / f.name)
        cfg = json.loads((folder / "config.json").read_text())
        cfg.setdefault("architectures", [{"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}.get(
            cfg.get("model_type"), "LlamaForCausalLM")])
        (model / "config.json").write_text(json.dumps(cfg))
        part = out.with_suffix(".part")
        _run([sys.executable, str(src / "convert_hf_to_gguf.py"), str(model), "--outtype", "f16",
              "--outfile", str(part)], env={**os.environ, "PYTHONPATH": str(src / "gguf-py")})
        part.rename(out)
    return out


def quantize(f16: Path, kind: str, out: Path, threads: int = 2) -> Path:
    """f16 GGUF -> out in `kind` (Q4_K_M, Q8_0, ...) by llama.cpp's `llama-quantize`."""
    if not out.exists():
        part = out.with_suffix(".part")
        _run([str(build_dir() / "bin" / "llama-quantize"), str(f16), str(part), kind, str(threads)])
        part.rename(out)
    return out


def make(folder: Path | None = None, types=TYPES, out: Path | None = None) -> dict[str, Path]:
    """{type: GGUF path} for `folder` (default: the offline model)."""
    why = missing()
    if why:
        raise RuntimeError(why)
    folder = folder or default_model_folder()
    out = out or cache_dir() / "ggufs" / folder.name
    out.mkdir(parents=True, exist_ok=True)
    f16 = convert(folder, out / f"{folder.name}-f16.gguf")
    return {t: f16 if t == "f16" else quantize(f16, t, out / f"{folder.name}-{t}.gguf") for t in types}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m switchsd.eval.ggufs", description=__doc__.split("\n\n")[0])
    ap.add_argument("--folder", type=Path, help="a transformers checkpoint folder (default: the offline model)")
    ap.add_argument("--types", default=",".join(TYPES), help="comma-separated llama-quantize types, f16 for none")
    ap.add_argument("--out", type=Path, help="output folder (default: <cache>/ggufs/<name>)")
    args = ap.parse_args(argv)
    try:
        files = make(args.folder, [t for t in args.types.split(",") if t], args.out)
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for t, p in files.items():
        print(f"{t}\t{p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
