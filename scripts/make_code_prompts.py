"""Write raw code-completion prompts for head training: function stubs (signature + docstring) from
Python's own standard library, in the shape of a HumanEval problem but never one of them.

    python scripts/make_code_prompts.py --output data/code_prompts.jsonl --count 400
    # held out from the head's training (the next 24 of the same shuffle): calibration for `eagle-trt tune`
    python scripts/make_code_prompts.py --output data/code_calibration.jsonl --count 24 --offset 400
    # more: the standard library plus installed packages, minus every stub already in the given files
    python scripts/make_code_prompts.py --output data/code_prompts_more.jsonl --count 3000 \
        --packages numpy,scipy,sympy --exclude data/code_prompts.jsonl --exclude data/code_calibration.jsonl

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


def _package_roots(names: str) -> list[Path]:
    import importlib.util

    roots = []
    for name in filter(None, (n.strip() for n in names.split(","))):
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit(f"--packages: {name!r} is not an installed package")
        roots += [Path(p) for p in spec.submodule_search_locations]
    return roots


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--output", required=True)
    ap.add_argument("--count", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--offset", type=int, default=0, help="skip this many of the shuffled stubs first")
    ap.add_argument("--packages", default="", help="comma-separated installed packages to take stubs from too")
    ap.add_argument("--exclude", action="append", default=[], type=Path,
                    help="a prompts file (repeatable): leave out every stub it holds")
    args = ap.parse_args()
    stubs: list[str] = []
    for root in [Path(sysconfig.get_paths()["stdlib"])] + _package_roots(args.packages):
        for path in sorted(root.rglob("*.py")):
            if SKIP_PARTS & set(path.relative_to(root).parts):
                continue
            stubs += _stubs(path)
    stubs = sorted(set(stubs))
    random.Random(args.seed).shuffle(stubs)
    if args.exclude:
        seen = {json.loads(x)["prompt"] for f in args.exclude for x in f.read_text(encoding="utf-8").splitlines()
                if x.strip()}
        stubs = [s for s in stubs if s not in seen]
    stubs = stubs[args.offset: args.offset + args.count]
    with open(args.output, "w") as f:
        for s in stubs:
            f.write(json.dumps({"prompt": s, "chat": False}) + "\n")
    print(f"{len(stubs)} code prompts -> {args.output}")


if __name__ == "__main__":
    main()
