"""Extract the contract a trtllm bundle must meet from a TensorRT-LLM source checkout.

    git clone --depth 1 --branch v1.2.1 https://github.com/NVIDIA/TensorRT-LLM ~/src/trtllm-1.2.1
    python scripts/extract_trtllm_contract.py --source ~/src/trtllm-1.2.1 --line 1.2 --ref v1.2.1 \
        --out tests/fixtures/trtllm_contract_1.2.json

The repository is large; the three files below are all it reads, so a dir holding just them at their paths,
fetched at a tag, does as well (`--commit` then records the tag's commit, which `git ls-remote` prints):

    for f in tensorrt_llm/llmapi/llm_args.py tensorrt_llm/_torch/models/modeling_speculative.py \
             tensorrt_llm/commands/serve.py; do
        curl -fsSL --create-dirs -o ~/src/trtllm-1.2.1/$f https://raw.githubusercontent.com/NVIDIA/TensorRT-LLM/v1.2.1/$f
    done
    python scripts/extract_trtllm_contract.py --source ~/src/trtllm-1.2.1 --line 1.2 --ref v1.2.1 \
        --commit "$(git ls-remote https://github.com/NVIDIA/TensorRT-LLM 'refs/tags/v1.2.1^{}' | cut -f1)" \
        --out tests/fixtures/trtllm_contract_1.2.json

Reads three files with Python's ast (nothing is imported or executed):

  tensorrt_llm/llmapi/llm_args.py                    pydantic fields of Eagle3DecodingConfig,
                                                     DraftTargetDecodingConfig, KvCacheConfig and TorchLlmArgs,
                                                     inherited ones included; validation aliases;
                                                     whether unknown fields are forbidden; the decoding_type tag;
                                                     and the decoding_type values the YAML path accepts
  tensorrt_llm/_torch/models/modeling_speculative.py the EAGLE-3 draft's module names (the weight-name prefixes
                                                     its loader reads) and whether it maps `layers.N.*` names
  tensorrt_llm/commands/serve.py                     the options of `trtllm-serve serve`

and writes them as JSON with the repository, ref, commit and each file's sha256. An existing --out
file keeps its hand-written keys (sources, pins, notes): only "extracted" is replaced, so a fixture
assembled from read-only sources can be regenerated from a checkout in place.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import subprocess
import sys
from pathlib import Path

LLM_ARGS = "tensorrt_llm/llmapi/llm_args.py"
SPECULATIVE = "tensorrt_llm/_torch/models/modeling_speculative.py"
SERVE = "tensorrt_llm/commands/serve.py"
CLASSES = ("Eagle3DecodingConfig", "DraftTargetDecodingConfig", "KvCacheConfig", "TorchLlmArgs")
STRICT_BASES = {"StrictBaseModel"}


def _name(node) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript):
        return _name(node.value)
    return ""


def _call_kw(call: ast.Call, key: str):
    return next((kw.value for kw in call.keywords if kw.arg == key), None)


def _strings(node) -> list[str]:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def parse_models(source: str) -> dict[str, dict]:
    """Every class of a module: its bases, own fields, aliases, strictness, and Literal tags."""
    classes = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.ClassDef):
            continue
        info = {"bases": [_name(b) for b in node.bases], "fields": [], "aliases": {}, "forbid": None, "tags": {}}
        for stmt in node.body:
            if isinstance(stmt, ast.Assign) and any(_name(t) == "model_config" for t in stmt.targets):
                extra = _call_kw(stmt.value, "extra") if isinstance(stmt.value, ast.Call) else None
                if isinstance(extra, ast.Constant):
                    info["forbid"] = extra.value == "forbid"
            if not isinstance(stmt, ast.AnnAssign) or not isinstance(stmt.target, ast.Name):
                continue
            name = stmt.target.id
            if name.startswith("_") or _name(stmt.annotation) == "ClassVar" or name == "model_config":
                continue
            value = stmt.value
            if isinstance(value, ast.Call) and _name(value.func) == "PrivateAttr":
                continue
            if isinstance(value, ast.Call) and _call_kw(value, "init") is not None:
                init = _call_kw(value, "init")
                if isinstance(init, ast.Constant) and init.value is False:
                    continue  # not settable by the user
            info["fields"].append(name)
            if isinstance(value, ast.Call):
                alias = _call_kw(value, "validation_alias")
                for choice in _strings(alias) if alias is not None else []:
                    if choice != name:
                        info["aliases"][choice] = name
            if _name(stmt.annotation) == "Literal":
                tags = _strings(stmt.annotation)
                if len(tags) == 1:
                    info["tags"][name] = tags[0]
        classes[node.name] = info
    return classes


def resolve(classes: dict, name: str) -> dict:
    """A class's fields with those of its bases in this module (bases first), strictness, aliases, tags."""
    info = classes[name]
    fields, aliases, tags, forbid = [], {}, {}, info["forbid"]
    for base in info["bases"]:
        if base in classes:
            inherited = resolve(classes, base)
            fields += [f for f in inherited["fields"] if f not in fields]
            aliases.update(inherited["aliases"])
            tags.update(inherited["tags"])
            forbid = inherited["extra"] == "forbid" if forbid is None else forbid
        elif base in STRICT_BASES and forbid is None:
            forbid = True
    fields += [f for f in info["fields"] if f not in fields]
    aliases.update(info["aliases"])
    tags.update(info["tags"])
    return {"fields": fields, "aliases": aliases, "tags": tags, "extra": "forbid" if forbid else "ignore",
            "complete": True}


def parse_decoding_types(source: str) -> list[str]:
    """The speculative_config.decoding_type values the YAML / trtllm-serve path accepts. Releases before the Literal
    tags dispatch in DecodingBaseConfig.from_dict over a dict literal of names; later ones take the decoding_type
    tags of DecodingBaseConfig's subclasses."""
    tree = ast.parse(source)
    by_name = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    base = by_name.get("DecodingBaseConfig")
    from_dict = next((n for n in base.body if isinstance(n, ast.FunctionDef) and n.name == "from_dict"), None) \
        if base else None
    for node in ast.walk(from_dict) if from_dict else []:
        if isinstance(node, ast.Dict) and node.keys and all(isinstance(k, ast.Constant) for k in node.keys):
            return sorted(k.value for k in node.keys)
    classes = parse_models(source)

    def derives(name: str) -> bool:
        bases = classes.get(name, {}).get("bases", [])
        return "DecodingBaseConfig" in bases or any(derives(b) for b in bases if b in classes)

    return sorted({info["tags"]["decoding_type"] for name, info in classes.items()
                   if derives(name) and "decoding_type" in info["tags"]})  # fmt: skip


def _self_attrs(cls: ast.ClassDef) -> list[str]:
    init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    names = []
    for node in ast.walk(init) if init else []:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Attribute) and _name(target.value) == "self" and \
                        isinstance(node.value, ast.Call) and not target.attr.startswith("_"):
                    names.append(target.attr)
    return sorted(set(names))


def parse_draft(source: str) -> dict:
    """Module names of the EAGLE-3 draft model and decoder layer, and the loader's layer-name mapping."""
    tree = ast.parse(source)
    by_name = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    out = {"draft_model_modules": _self_attrs(by_name["Eagle3DraftModel"]),
           "decoder_layer_modules": _self_attrs(by_name["Eagle3DecoderLayer"])}  # fmt: skip
    model = by_name.get("Eagle3ForCausalLM")
    loader = next((n for n in model.body if isinstance(n, ast.FunctionDef) and n.name == "load_weights"), None)
    texts = _strings(loader) if loader else []
    out["maps_layers_prefix"] = any("midlayer" in t for t in texts) and any("layers" in t for t in texts)
    out["registered_as"] = sorted({s for d in model.decorator_list if isinstance(d, ast.Call) for s in _strings(d)})
    return out


def parse_serve_options(source: str) -> list[str]:
    tree = ast.parse(source)
    serve = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "serve")
    options = []
    for deco in serve.decorator_list:
        if isinstance(deco, ast.Call) and _name(deco.func) == "option":
            options += [s for s in _strings(ast.Tuple(elts=deco.args, ctx=ast.Load())) if s.startswith("--")]
    return sorted(set(options))


def extract(root: Path) -> dict:
    llm_args = (root / LLM_ARGS).read_text(encoding="utf-8")
    classes = parse_models(llm_args)
    out = {"classes": {name: resolve(classes, name) for name in CLASSES if name in classes},
           "decoding_types": parse_decoding_types(llm_args)}  # fmt: skip
    if (root / SPECULATIVE).is_file():
        out["draft_checkpoint"] = parse_draft((root / SPECULATIVE).read_text(encoding="utf-8"))
    if (root / SERVE).is_file():
        out["trtllm_serve_options"] = parse_serve_options((root / SERVE).read_text(encoding="utf-8"))
    out["files"] = {rel: hashlib.sha256((root / rel).read_bytes()).hexdigest()
                    for rel in (LLM_ARGS, SPECULATIVE, SERVE) if (root / rel).is_file()}  # fmt: skip
    return out


def _commit(root: Path) -> str | None:
    try:
        return subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", type=Path, required=True, help="a TensorRT-LLM source checkout")
    ap.add_argument("--line", required=True, help="the eagle-trt line this checkout belongs to (1.2 or 1.3+)")
    ap.add_argument("--ref", required=True, help="the tag or branch checked out, e.g. v1.2.1")
    ap.add_argument("--commit", help="the commit of --ref (default: git rev-parse HEAD in --source, when it is a "
                    "checkout)")
    ap.add_argument("--out", type=Path, help="fixture to write (default: print)")
    args = ap.parse_args(argv)
    if not (args.source / LLM_ARGS).is_file():
        print(f"error: {args.source / LLM_ARGS} not found: --source must be a TensorRT-LLM checkout", file=sys.stderr)
        return 2
    extracted = extract(args.source)
    commit = args.commit or _commit(args.source)
    if commit is not None and (len(commit) != 40 or any(c not in "0123456789abcdef" for c in commit.lower())):
        print(f"error: --commit {commit!r} is not a 40-hex-digit commit", file=sys.stderr)
        return 2
    extracted["source"] = {"repo": "NVIDIA/TensorRT-LLM", "ref": args.ref, "commit": commit}
    doc = json.loads(args.out.read_text(encoding="utf-8")) if args.out and args.out.is_file() else {}
    doc.update(line=args.line, extracted=extracted)
    text = json.dumps(doc, indent=2) + "\n"
    if args.out:
        tmp = args.out.with_name(f".{args.out.name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(args.out)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
