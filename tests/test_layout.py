"""The package layout holds: the library (core, drafters, target, factory, io) and the studio import no
command-line module, and no module grows past the size a reader takes in at once."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ["switchsd/core", "switchsd/drafters", "switchsd/target", "switchsd/factory.py", "switchsd/io.py", "app",
           "switchsd/serve/batched.py", "switchsd/serve/engine.py", "switchsd/serve/drafting.py",
           "switchsd/serve/load.py"]
# command-line modules: argument parsing and `main()`; the library never reaches up into them
CLI = ("switchsd.cli", "switchsd.bench", "switchsd.generate", "switchsd.calibrate", "switchsd.analysis",
       "switchsd.tempsweep", "switchsd.train_eagle3", "switchsd.eval.bench", "switchsd.eval.analysis",
       "switchsd.eval.tempsweep", "switchsd.training.eagle3", "switchsd.quality", "switchsd.eval.quality",
       "switchsd.serve_bench", "switchsd.serve.bench")


def _modules(spec: str) -> list[Path]:
    p = ROOT / spec
    return [p] if p.is_file() else sorted(p.rglob("*.py"))


def _imports(path: Path) -> set[str]:
    pkg = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = pkg.split(".")[:len(pkg.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            out |= {base} | {f"{base}.{a.name}" for a in node.names}
    return out


def test_library_and_app_import_no_command_line_module():
    bad = [(str(p.relative_to(ROOT)), m) for spec in LIBRARY for p in _modules(spec) for m in _imports(p)
           if any(m == c or m.startswith(c + ".") for c in CLI)]
    assert not bad, bad


def test_the_import_check_sees_relative_imports():
    assert "switchsd.cli.common" in _imports(ROOT / "switchsd/eval/bench.py")
    assert "switchsd.core.config" in _imports(ROOT / "switchsd/drafters/copy.py")


def test_no_module_over_the_size_limit():
    big = [(str(p.relative_to(ROOT)), n) for d in ("switchsd", "app", "probes") for p in (ROOT / d).rglob("*.py")
           if (n := len(p.read_text().splitlines())) > 420]
    assert not big, big
