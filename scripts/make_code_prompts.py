"""Write raw code-completion prompts for head training: function stubs (signature + docstring) from
Python's own standard library, in the shape of a HumanEval problem but never one of them.

    python scripts/make_code_prompts.py --output data/code_prompts.jsonl --count 400
    # held out from the head's training (the next 24 of the same shuffle): calibration for `eagle-trt tune`
    python scripts/make_code_prompts.py --output data/code_calibration.jsonl --count 24 --offset 400

Each line is `{"prompt": "<imports>\\n\\ndef f(...):\\n    \"\"\"doc\"\"\"\\n", "chat": false}`: the target
continues the code as a plain completion (no chat template), which is how `bench --prompts humaneval`
sends its prompts. Deterministic for a given Python version (files sorted, fixed seed). HumanEval
itself is not used, so the bench's HumanEval numbers measure a head that never saw those problems.
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import sysconfig
from pathlib import Path

SKIP_PARTS = {"test", "tests", "idlelib", "lib2to3", "turtledemo", "ensurepip", "tkinter", "site-packages",
              "__pycache__", "pydoc_data", "unittest"}


def _stubs(path: Path) -> list[str]:
    try:
        src = path.read_text(encoding="utf-8")
        tree = ast.parse(src)
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return []
    lines = src.splitlines()
    imports = [ast.get_source_segment(src, n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    header = "\n".join(i for i in imports[:4] if i and "\n" not in i)
    out = []
    for node in tree.body:  # module-level functions only: self-contained, like HumanEval
        if not isinstance(node, ast.FunctionDef) or node.name.startswith("_") or node.decorator_list:
            continue
        doc = ast.get_docstring(node, clean=False)
        if not doc or not 40 <= len(doc) <= 700 or not node.body:
            continue
        first = node.body[0]  # the docstring expression
        end = first.end_lineno
        stub = "\n".join(lines[node.lineno - 1:end]) + "\n"
        if len(node.body) < 2 or len(stub) > 1200:  # needs a real body to complete
            continue
        out.append((header + "\n\n\n" if header else "") + stub)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--output", required=True)
    ap.add_argument("--count", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--offset", type=int, default=0, help="skip this many of the shuffled stubs first")
    args = ap.parse_args()
    root = Path(sysconfig.get_paths()["stdlib"])
    stubs: list[str] = []
    for path in sorted(root.rglob("*.py")):
        if SKIP_PARTS & set(path.relative_to(root).parts):
            continue
        stubs += _stubs(path)
    stubs = sorted(set(stubs))
    random.Random(args.seed).shuffle(stubs)
    stubs = stubs[args.offset: args.offset + args.count]
    with open(args.output, "w") as f:
        for s in stubs:
            f.write(json.dumps({"prompt": s, "chat": False}) + "\n")
    print(f"{len(stubs)} code prompts -> {args.output}")


if __name__ == "__main__":
    main()
