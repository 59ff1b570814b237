"""Does eagle-trt (core) resolve beside a TensorRT-LLM line's published pins? pip --dry-run, nothing installed.

    python scripts/check_trtllm_install.py --line 1.2

The pins come from tests/fixtures/trtllm_contract_<line>.json ("pins", with the requirements.txt
they were read from). pip resolves this checkout's core package together with them, fetching
metadata only, and every pin must come out as pinned. TensorRT-LLM's own wheel is not on PyPI, so
its pins stand in for it. Needs PyPI. Exit 0 resolves, 1 does not, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"


def pins_of(line: str) -> list[str]:
    path = FIXTURES / f"trtllm_contract_{line.replace('+', '')}.json"
    if not path.is_file():
        raise SystemExit(f"error: no contract fixture for line {line!r} ({path.name})")
    return json.loads(path.read_text(encoding="utf-8"))["pins"]


def resolve(pins: list[str], timeout: int) -> dict[str, str]:
    """{package: version} pip would install for this checkout plus the pins (raises CalledProcessError)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
               "--report", str(report), str(REPO), *pins]  # fmt: skip
        subprocess.run(cmd, check=True, timeout=timeout, capture_output=True, text=True)
        data = json.loads(report.read_text(encoding="utf-8"))
    return {item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"] for item in data["install"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--line", default="1.2", help="TensorRT-LLM line whose pins to resolve against (default 1.2)")
    ap.add_argument("--timeout", type=int, default=600)
    args = ap.parse_args(argv)
    pins = pins_of(args.line)
    try:
        found = resolve(pins, args.timeout)
    except subprocess.CalledProcessError as exc:
        tail = (exc.stderr or exc.stdout or "").strip().splitlines()[-3:]
        print(f"FAIL: eagle-trt does not resolve beside TensorRT-LLM {args.line}'s pins: {' | '.join(tail)}")
        return 1
    except subprocess.TimeoutExpired:
        print(f"FAIL: pip did not finish resolving in {args.timeout} s")
        return 1
    wrong = []
    for pin in pins:
        req = Requirement(pin)
        have = found.get(req.name.lower())
        if have is None or not req.specifier.contains(have, prereleases=True):
            wrong.append(f"{pin} (pip chose {have})")
    if "eagle-trt" not in found:
        wrong.append("eagle-trt itself is not in the resolution")
    if wrong:
        print(f"FAIL: resolved, but not as TensorRT-LLM {args.line} pins: {', '.join(wrong)}")
        return 1
    shown = ", ".join(f"{n} {found[n]}" for n in ("eagle-trt", "torch", "transformers", "nvidia-modelopt", "numpy")
                      if n in found)  # fmt: skip
    print(f"OK: eagle-trt resolves beside TensorRT-LLM {args.line}'s pins ({shown}; {len(found)} packages)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
