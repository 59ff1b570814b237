"""The import graph keeps its layers (pyproject.toml's import-linter contracts) and each contract can fail."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LINT = [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; "
        "sys.exit(lint_imports_command())"]


def lint(cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(LINT, cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(cwd), "PATH": "/usr/bin:/bin"})


def test_the_contracts_hold():
    r = lint(REPO)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "BROKEN" not in r.stdout and r.stdout.count("KEPT") == 3


@pytest.mark.parametrize("module, line, broken", [
    # an upward import, even inside a function: the engine layer reaching for the runtime
    ("eagle_trt/engine/manifest.py", "def _up():\n    from eagle_trt.runtime import session\n", "layers"),
    # a shared helper importing a layer
    ("eagle_trt/errors.py", "def _up():\n    import eagle_trt.config.decode\n", "shared helpers"),
    # a cycle inside a package
    ("eagle_trt/speculative/tree.py", "def _back():\n    from eagle_trt.speculative import verify\n",
     "no import cycles"),
])
def test_each_contract_catches_what_it_forbids(tmp_path, module, line, broken):
    import shutil

    shutil.copytree(REPO / "eagle_trt", tmp_path / "eagle_trt", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    with open(tmp_path / module, "a", encoding="utf-8") as f:
        f.write("\n\n" + line)
    r = lint(tmp_path)
    assert r.returncode != 0
    assert [ln for ln in r.stdout.splitlines() if ln.endswith("BROKEN")], r.stdout[-2000:]
    assert broken in r.stdout.split("Broken contracts")[-1]
