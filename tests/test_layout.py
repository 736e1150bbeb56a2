"""The package layout holds: the library (core, drafters, target, factory, io) and the studio import no
command-line module, and no module grows past the size a reader takes in at once."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ["switchsd/core", "switchsd/drafters", "switchsd/models", "switchsd/factory.py", "switchsd/io.py", "app",
           "switchsd/serve/batched.py", "switchsd/serve/engine.py", "switchsd/serve/drafting.py",
           "switchsd/serve/load.py"]
# command-line modules: argument parsing and `main()`; the library never reaches up into them
CLI = ("switchsd.cli", "switchsd.__main__", "switchsd.eval.bench", "switchsd.eval.analysis", "switchsd.eval.tempsweep",
       "switchsd.training.eagle3", "switchsd.training.regen_job", "switchsd.eval.quality", "switchsd.serve.bench")


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


def test_core_depends_on_nothing_above_it():
    """switchsd/core (the algorithm: configs, tree, verification, policies, the engine loop, the drafter protocol)
    imports no other part of the package: drafters, models, the factory and the rest build on it."""
    bad = [(str(p.relative_to(ROOT)), m) for p in _modules("switchsd/core") for m in _imports(p)
           if m.startswith("switchsd.") and not m.startswith("switchsd.core")]
    assert not bad, bad


def test_the_direction_check_bites(tmp_path, monkeypatch):
    """The check above on a planted upward import (a core module that imports a drafter) reports it."""
    planted = ROOT / "switchsd" / "core" / "_planted_upward_import.py"
    planted.write_text("from ..drafters.copy import CopyDrafter\n")
    try:
        with __import__("pytest").raises(AssertionError, match="drafters.copy"):
            test_core_depends_on_nothing_above_it()
    finally:
        planted.unlink()


def test_one_command_lists_every_subcommand(capsys):
    from switchsd.cli.main import SUBCOMMANDS, main
    main(["--help"])
    out = capsys.readouterr().out
    assert all(name in out for name in SUBCOMMANDS)
    assert not [p.name for p in (ROOT / "switchsd").glob("*.py")
                if p.name not in ("__init__.py", "__main__.py", "envs.py", "factory.py", "io.py", "methods.py")], \
        "no command shim modules at the package top"


def test_the_import_check_sees_relative_imports():
    assert "switchsd.cli.common" in _imports(ROOT / "switchsd/eval/bench.py")
    assert "switchsd.core.config" in _imports(ROOT / "switchsd/drafters/copy.py")


def test_no_module_over_the_size_limit():
    big = [(str(p.relative_to(ROOT)), n) for d in ("switchsd", "app", "probes") for p in (ROOT / d).rglob("*.py")
           if (n := len(p.read_text().splitlines())) > 420]
    assert not big, big


def _script_offences(path: Path) -> list[str]:
    """sys.path edits and reads of private names (`obj._name`) in one script."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute):
            if node.attr == "path" and isinstance(node.value, ast.Name) and node.value.id == "sys":
                out.append(f"{path.name}:{node.lineno}: sys.path")
            elif node.attr.startswith("_") and not node.attr.startswith("__"):
                out.append(f"{path.name}:{node.lineno}: .{node.attr}")
    return out


def test_scripts_edit_no_import_path_and_read_no_private_name(tmp_path):
    offences = [o for p in sorted((ROOT / "scripts").rglob("*.py")) for o in _script_offences(p)]
    assert offences == []
    planted = tmp_path / "bad.py"                     # the check bites
    planted.write_text("import sys\nsys.path.insert(0, '.')\nx = eng._forward\n")
    assert len(_script_offences(planted)) == 2


def test_every_script_is_run_by_a_make_target_or_a_test_or_listed_as_a_dev_tool():
    users = (ROOT / "Makefile").read_text() + "".join(p.read_text() for p in (ROOT / "tests").glob("*.py"))
    unused = [p.name for p in (ROOT / "scripts").iterdir() if p.is_file() and f"scripts/{p.name}" not in users]
    assert unused == [], "each script in scripts/ is run by a make target or a test"
    listed = (ROOT / "scripts" / "dev" / "README.md").read_text()
    unlisted = [p.name for p in (ROOT / "scripts" / "dev").glob("*.py") if f"`{p.name}`" not in listed]
    assert unlisted == [], "each development tool has its one-line purpose in scripts/dev/README.md"


def test_the_subcommand_groups_list_their_members_and_refuse_others(capsys):
    import pytest

    from switchsd.cli.groups import GROUPS, run
    for group, table in GROUPS.items():
        run(group, ["--help"])
        out = capsys.readouterr().out
        assert all(name in out for name in table), group
        with pytest.raises(SystemExit, match=f"unknown `switchsd {group}` subcommand 'nope'"):
            run(group, ["nope"])
    import importlib
    for table in GROUPS.values():            # every member's module exists and has its main(argv)
        for module, _ in table.values():
            assert callable(importlib.import_module(module).main), module
