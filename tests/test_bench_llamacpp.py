"""`bench --methods llama.cpp,llama.cpp-lookup`: by contract, with a stand-in module of llama-cpp-python's API shape
(`Llama(model_path, n_ctx=, n_threads=, n_threads_batch=, draft_model=, ...)`, `.tokenize(bytes, add_bos, special)`,
`.reset()`, `.generate(tokens, temp=, ...)`, `llama_speculative.LlamaPromptLookupDecoding(max_ngram_size,
num_pred_tokens)`, `llama_print_system_info()`, `_ggml.libggml`), asserting what the bench calls and how it reports;
and for real on SmolLM2 when llama_cpp is importable."""

import json
import os
import sys
import types
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from eagle_trt.cli.app import app

cli = CliRunner()
REPO = Path(__file__).resolve().parents[1]
GGUF = Path(os.environ.get("EAGLE_TRT_SMOLLM2_GGUF", REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
NEW = 12


@pytest.fixture(scope="module")
def engine(tiny_checkpoint, tmp_path_factory):
    from conftest import build_tiny_engine

    return build_tiny_engine(tiny_checkpoint, tmp_path_factory.mktemp("bench-llama"))


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "p.jsonl"
    rows = [{"id": "a", "prompt": "Hello world"}, {"id": "b", "prompt": "abc abc abc", "chat": False},
            {"id": "c", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
                                     {"role": "user", "content": "more"}]}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


@pytest.fixture(scope="module")
def reference(engine, prompt_file):
    """Our tokenizer, and each prompt's ids -> our `ar` greedy output (what a llama.cpp that agrees would give)."""
    from eagle_trt.bench.prompts import load_prompts
    from eagle_trt.runtime.session import Session

    s = Session.open(engine)
    outputs = {}
    for p in load_prompts(str(prompt_file)):
        ids = p.encode(s.tokenizer)
        outputs[tuple(ids)] = s.runner.generate(ids, s.decode_config(mode="ar", max_new_tokens=NEW)).token_ids
    return s.tokenizer, outputs


class FakeLookup:
    def __init__(self, max_ngram_size: int = 2, num_pred_tokens: int = 10):
        self.max_ngram_size, self.num_pred_tokens = max_ngram_size, num_pred_tokens


def fake_llama_cpp(tokenizer, outputs, calls, part_at=None, tokenize_part=None):
    """A llama_cpp module whose Llama decodes like our ar (the recorded outputs, then token 1 forever), with the
    output altered at token part_at["plain"] (a Llama without drafter) or part_at["lookup"] (with one), and the
    tokenization of prompt text containing `tokenize_part[0]` altered at position tokenize_part[1]."""

    class Llama:
        def __init__(self, model_path, *, n_ctx=512, n_threads=None, n_threads_batch=None, draft_model=None,
                     **kwargs):
            self.kwargs = dict(model_path=model_path, n_ctx=n_ctx, n_threads=n_threads,
                               n_threads_batch=n_threads_batch, draft_model=draft_model, **kwargs)
            self.events, self.tokenized, self.draft_model = [], [], draft_model
            calls.append(self)

        def close(self):
            self.events.append("close")

        def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False):
            assert isinstance(text, bytes) and special
            self.tokenized.append((text.decode("utf-8"), add_bos))
            ids = list(tokenizer(text.decode("utf-8"), add_special_tokens=add_bos).input_ids)
            if tokenize_part and tokenize_part[0] in text.decode():
                ids[tokenize_part[1]] += 1
            return ids

        def reset(self):
            self.events.append("reset")

        def n_vocab(self):
            return 256

        def generate(self, tokens, temp=0.8, repeat_penalty=1.1, reset=True, **kwargs):
            self.events.append(("generate", list(tokens), temp, repeat_penalty))
            out = list(outputs[tuple(tokens)])
            at = (part_at or {}).get("plain" if self.kwargs["draft_model"] is None else "lookup")
            if at is not None and at < len(out):
                out[at] = (out[at] + 1) % 256
            yield from out
            while True:
                yield 1

    lib = types.SimpleNamespace(ggml_commit=lambda: b"0c1e570", ggml_version=lambda: b"0.9.4")
    module = types.ModuleType("llama_cpp")
    module.__version__ = "0.3.36"
    module.Llama = Llama
    module.llama_print_system_info = lambda: b"CPU : AVX2 = 1 | AVX512 = 1 |"
    spec = types.ModuleType("llama_cpp.llama_speculative")
    spec.LlamaPromptLookupDecoding = FakeLookup
    ggml = types.ModuleType("llama_cpp._ggml")
    ggml.libggml = lib
    return {"llama_cpp": module, "llama_cpp.llama_speculative": spec, "llama_cpp._ggml": ggml}


def run_bench(engine, prompt_file, out, *extra):
    return cli.invoke(app, ["bench", "--engine", str(engine), "--prompts", str(prompt_file), "--max-new-tokens",
                            str(NEW), "--repeats", "2", "--threads", "1", "--out", str(out), "--no-roofline",
                            "--no-plots", "--skip-verify", *extra])


def test_bench_runs_llama_cpp_on_our_token_ids_and_reports_it(engine, prompt_file, reference, tmp_path, monkeypatch):
    tokenizer, outputs = reference
    calls = []
    for name, mod in fake_llama_cpp(tokenizer, outputs, calls).items():
        monkeypatch.setitem(sys.modules, name, mod)
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    out = tmp_path / "out"
    r = run_bench(engine, prompt_file, out, "--methods", "llama.cpp,llama.cpp-lookup", "--gguf", str(gguf))
    assert r.exit_code == 0, r.output
    res = json.loads((out / "results.json").read_text())
    assert res["config"]["methods"] == ["ar", "llama.cpp", "llama.cpp-lookup"]  # ar joins: the reference
    plain, lookup = calls
    for llama in calls:  # the bench's GGUF, its threads, CPU only, room for the longest prompt plus the output
        kw = llama.kwargs
        assert (kw["model_path"], kw["n_threads"], kw["n_threads_batch"], kw["n_gpu_layers"]) == (str(gguf), 1, 1, 0)
        assert kw["n_ctx"] == 64 + NEW and kw["verbose"] is False
        assert llama.events[-1] == "close" and llama.events.count("close") == 1  # freed after the runs
        events = llama.events[:-1]
        gens = [e for e in events if e != "reset"]
        assert len(gens) == 1 + 2 * 3  # the warm-up, then 2 repeats x 3 prompts
        assert all(e == "reset" for e in events[0::2]) and len(events) == 2 * len(gens)
        assert {tuple(g[1]) for g in gens[1:]} == set(outputs)  # our token ids, never text
        assert all(g[2] == 0.0 and g[3] == 1.0 for g in gens)  # greedy, no repeat penalty
    # The chat template's rendering is tokenized without added specials, a raw prompt (b) with them, as ours are.
    assert [(t.startswith("abc"), bos) for t, bos in plain.tokenized] == [(False, False), (True, True), (False, False)]
    assert plain.kwargs["draft_model"] is None
    draft = lookup.kwargs["draft_model"]
    assert isinstance(draft, FakeLookup) and (draft.max_ngram_size, draft.num_pred_tokens) == (2, 2)
    assert res["methods"]["llama.cpp-lookup"]["speculative"] and not res["methods"]["llama.cpp"]["speculative"]
    assert res["methods"]["llama.cpp-lookup"]["draft_model"] == {"LlamaPromptLookupDecoding": {
        "max_ngram_size": 2, "num_pred_tokens": 2}}
    info = res["llama_cpp"]
    assert (info["llama_cpp_python"], info["llama_cpp_commit"], info["ggml_version"]) == ("0.3.36", "0c1e570", "0.9.4")
    assert info["system_info"].startswith("CPU : AVX2") and info["threads"] == 1 and info["gguf"] == str(gguf)
    assert info["tokenizer"] == {"prompts": 3, "agree": 3, "mismatches": []}
    for name in ("llama.cpp", "llama.cpp-lookup"):
        assert info["greedy_vs_ar"][name] == {"reference": "ar", "prompts": 3, "equal": 3, "first_difference": {}}
        s = res["summary"][name]
        assert s["generated_tokens"] == sum(len(v) for v in outputs.values()) and s["tokens_per_second"]["min"] > 0
        assert res["speedups"]["ar"][name]["median"] > 0  # llama.cpp is a baseline: "vs llama.cpp"
    assert info["speculative_vs_plain"] == {"llama.cpp-lookup": {"reference": "llama.cpp", "prompts": 3, "equal": 3,
                                                            "first_difference": {}}}
    assert not res["failures"] and not res["warnings"]
    assert "vs llama.cpp" in r.stdout
    assert "llama.cpp: llama-cpp-python 0.3.36, llama.cpp 0c1e570; tokenizer agrees on 3/3 prompts" in r.stdout
    md = (out / "report.md").read_text()
    assert "## llama.cpp" in md and "`llama.cpp-lookup` greedy tokens equal `ar`'s on 3 of 3 prompts" in md


def test_where_llama_cpp_parts_from_us_is_reported_not_failed(engine, prompt_file, reference, tmp_path, monkeypatch):
    tokenizer, outputs = reference
    calls = []
    fake = fake_llama_cpp(tokenizer, outputs, calls, part_at={"plain": 5, "lookup": 7}, tokenize_part=("abc", 2))
    for name, mod in fake.items():
        monkeypatch.setitem(sys.modules, name, mod)
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    out = tmp_path / "out"
    r = run_bench(engine, prompt_file, out, "--methods", "ar,llama.cpp,llama.cpp-lookup", "--gguf", str(gguf))
    assert r.exit_code == 0, r.output
    res = json.loads((out / "results.json").read_text())
    info = res["llama_cpp"]
    assert info["greedy_vs_ar"]["llama.cpp"]["first_difference"] == {"a": 5, "b": 5, "c": 5}
    assert info["greedy_vs_ar"]["llama.cpp"]["equal"] == 0
    assert info["greedy_vs_ar"]["llama.cpp-lookup"]["first_difference"] == {"a": 7, "b": 7, "c": 7}
    # llama.cpp's speculation against its own plain decoding: they part where the plain output was altered.
    assert info["speculative_vs_plain"]["llama.cpp-lookup"]["first_difference"] == {"a": 5, "b": 5, "c": 5}
    (tok,) = info["tokenizer"]["mismatches"]
    assert (tok["prompt"], tok["first_difference"], info["tokenizer"]["agree"]) == ("b", 2, 2)
    assert "Warning: llama.cpp tokenizes prompt b differently from ours from token 2" in r.stderr
    kinds = [w["kind"] for w in res["warnings"]]
    assert kinds.count("llama_cpp_differs") == 12 and kinds.count("llama_cpp_tokenizer") == 1
    assert "llama.cpp = ar on 0/3 (parts on a at token 5, b at token 5, c at token 5)" in r.stdout
    md = (out / "report.md").read_text()
    assert "llama.cpp tokenizes 2 of 3 prompts exactly as ours" in md and "a at token 5" in md
    assert "`llama.cpp-lookup` greedy tokens equal `llama.cpp`'s on 0 of 3 prompts (parts on a at token 5" in md


def test_llama_cpp_stops_where_ours_do():
    """An EOS token of the engine's ends the output (kept, as our runtime keeps it), else max_new_tokens."""
    from eagle_trt.bench.llamacpp import LlamaCppMethod

    class Stub:
        def reset(self):
            pass

        def generate(self, tokens, **kw):
            yield from [5, 6, 2, 7, 8, 9, 10]

    assert LlamaCppMethod("llama.cpp", Stub(), [2], {}).run([1], 10).token_ids == [5, 6, 2]
    assert LlamaCppMethod("llama.cpp", Stub(), [99], {}).run([1], 4).token_ids == [5, 6, 2, 7]


class StubDraftLlama:
    """The part of `Llama` a GGUFDrafter uses: input_ids / n_tokens, eval (drops the cache past n_tokens, then
    decodes), sample (here: the last decoded token + 1, so stale logits show)."""

    def __init__(self):
        self.input_ids, self.n_tokens, self.evals, self.last = [0] * 64, 0, [], None

    def eval(self, tokens):
        self.input_ids[self.n_tokens:self.n_tokens + len(tokens)] = tokens
        self.n_tokens += len(tokens)
        self.evals.append(list(tokens))
        self.last = tokens[-1] if tokens else self.last

    def sample(self, temp=0.8, repeat_penalty=1.1):
        assert temp == 0.0 and repeat_penalty == 1.0
        return self.last + 1


def test_the_gguf_drafter_drafts_a_greedy_chain_and_keeps_the_shared_prefix_cached():
    import numpy as np

    from eagle_trt.bench.llamacpp import GGUFDrafter

    stub = StubDraftLlama()
    draft = GGUFDrafter(stub, 3)
    ids = np.array([5, 6, 7], dtype=np.intc)
    assert list(draft(ids)) == [8, 9, 10] and stub.evals == [[5, 6, 7], [8], [9]]
    # The target accepted 8 and 9, then its own 20: only 20 is new to the draft's cache.
    assert list(draft(np.array([5, 6, 7, 8, 9, 20]))) == [21, 22, 23] and stub.evals[3:] == [[20], [21], [22]]
    # All of it rejected (30 instead of 21): the draft's cache is cut back to the accepted prefix.
    assert list(draft(np.array([5, 6, 7, 8, 9, 20, 30]))) == [31, 32, 33] and stub.evals[6] == [30]
    assert stub.n_tokens == 9
    # A context the draft has evaluated already: its last token is decoded again, for fresh logits.
    assert list(draft(np.array([5, 6, 7, 8, 9, 20, 30, 31]))) == [32, 33, 34] and stub.evals[9] == [31]


def test_llama_cpp_draft_runs_a_second_llama_on_the_draft_gguf(engine, prompt_file, reference, tmp_path,
                                                               monkeypatch):
    from eagle_trt.bench.llamacpp import DRAFT_TOKENS, GGUFDrafter

    tokenizer, outputs = reference
    calls = []
    for name, mod in fake_llama_cpp(tokenizer, outputs, calls).items():
        monkeypatch.setitem(sys.modules, name, mod)
    gguf, small = tmp_path / "model.gguf", tmp_path / "small.gguf"
    gguf.write_bytes(b"GGUF")
    small.write_bytes(b"GGUF")
    out = tmp_path / "out"
    r = run_bench(engine, prompt_file, tmp_path / "o0", "--methods", "llama.cpp-draft", "--gguf", str(gguf))
    assert r.exit_code == 2 and "--methods llama.cpp-draft needs --draft-gguf FILE" in r.stderr, r.output
    calls.clear()
    r = run_bench(engine, prompt_file, out, "--methods", "llama.cpp,llama.cpp-draft", "--gguf", str(gguf),
                  "--draft-gguf", str(small))
    assert r.exit_code == 0, r.output
    plain, drafter, target = calls  # the draft's Llama is made before the target's that holds it
    assert drafter.kwargs["model_path"] == str(small) and drafter.kwargs["draft_model"] is None
    assert drafter.kwargs["n_ctx"] == 64 + NEW + DRAFT_TOKENS and drafter.kwargs["n_threads"] == 1
    assert isinstance(target.kwargs["draft_model"], GGUFDrafter) and target.kwargs["draft_model"].llama is drafter
    assert target.kwargs["model_path"] == str(gguf) and plain.kwargs["draft_model"] is None
    res = json.loads((out / "results.json").read_text())
    assert res["methods"]["llama.cpp-draft"]["draft_model"] == {"GGUFDrafter": {"gguf": str(small),
                                                                                 "num_pred_tokens": DRAFT_TOKENS}}
    assert res["llama_cpp"]["speculative_vs_plain"]["llama.cpp-draft"]["equal"] == 3
    # every Llama (the drafter's too) is freed once the runs are done, before the verify-cost curve is timed
    assert all(c.events.count("close") == 1 and c.events[-1] == "close" for c in calls)


def test_llama_cpp_bad_input(engine, prompt_file, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # not installed: the import fails
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    r = run_bench(engine, prompt_file, tmp_path / "o1", "--methods", "llama.cpp", "--gguf", str(gguf))
    assert r.exit_code == 3 and "needs the optional llama-cpp-python package" in r.stderr, r.output
    assert "make llama-cpp" in r.stderr
    monkeypatch.setitem(sys.modules, "llama_cpp", types.ModuleType("llama_cpp"))
    r = run_bench(engine, prompt_file, tmp_path / "o2", "--methods", "llama.cpp")
    assert r.exit_code == 2 and "--methods llama.cpp needs --gguf FILE" in r.stderr, r.output
    r = run_bench(engine, prompt_file, tmp_path / "o3", "--methods", "llama.cpp", "--gguf", str(tmp_path / "x.gguf"))
    assert r.exit_code == 2 and "x.gguf: not a .gguf file" in r.stderr, r.output


@pytest.mark.slow
def test_llama_cpp_for_real_on_smollm2(tmp_path_factory):
    """The installed llama-cpp-python on SmolLM2's GGUF, against an engine converted from the same file."""
    llama_cpp = pytest.importorskip("llama_cpp")
    if not GGUF.is_file():
        pytest.skip(f"{GGUF} not found; run `make model`")
    from eagle_trt.bench.harness import bench_engine
    from eagle_trt.config import parse_config
    from eagle_trt.convert import convert_model
    from eagle_trt.engine.builder import build_engine

    tmp = tmp_path_factory.mktemp("smollm2-llama")
    convert_model(GGUF, tmp / "ckpt", head=REPO / "heads" / "smollm2-135m-instruct", progress=False)  # no training
    build_engine(parse_config({"name": "smol", "checkpoint_dir": str(tmp / "ckpt"), "max_output_len": 64}),
                 output_dir=tmp / "engine")
    torch.set_num_threads(1)
    names = ["llama.cpp", "llama.cpp-lookup", "llama.cpp-draft"]  # the GGUF drafting for itself
    res = bench_engine(tmp / "engine", "chat", limit=3, max_new_tokens=24, repeats=1, methods=["ar", *names],
                       machine=False, plots=False, gguf=GGUF, draft_gguf=GGUF)
    info = res["llama_cpp"]
    assert info["llama_cpp_python"] == llama_cpp.__version__ and info["threads"] == 1
    assert info["tokenizer"]["prompts"] == 3
    assert info["tokenizer"]["agree"] == 3, info["tokenizer"]["mismatches"]  # SmolLM2's BPE: llama.cpp agrees
    assert set(info["speculative_vs_plain"]) == {"llama.cpp-lookup", "llama.cpp-draft"}
    for name in names:
        g = info["greedy_vs_ar"][name]
        assert g["prompts"] == 3 and g["equal"] + len(g["first_difference"]) == 3
        assert res["summary"][name]["tokens_per_second"]["median"] > 0
        assert 3 <= res["summary"][name]["generated_tokens"] <= 3 * 24


def test_make_llama_cpp_builds_without_the_tiles_on_an_amx_cpu():
    """scripts/llama_cpp_cmake_args.py: GGML_NATIVE where the CPU has no AMX-INT8; where it has, every vector extension
    it has, explicitly, and the tiles off (ggml's AMX product crashes there)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    from llama_cpp_cmake_args import cmake_args, cpu_flags

    zen5 = cpu_flags("processor : 0\nflags : fpu sse4_2 avx avx2 fma f16c bmi2 avx512f avx512_vnni avx512_bf16\n")
    assert cmake_args(zen5) == "-DGGML_NATIVE=ON"
    args = cmake_args(zen5 | {"amx_tile", "amx_int8", "amx_bf16", "avx512vbmi"}).split()
    assert args[0] == "-DGGML_NATIVE=OFF" and "-DGGML_AMX_INT8=OFF" in args and "-DGGML_AMX_TILE=OFF" in args
    assert {"-DGGML_AVX512=ON", "-DGGML_AVX512_VNNI=ON", "-DGGML_AVX512_BF16=ON", "-DGGML_AVX512_VBMI=ON",
            "-DGGML_AVX2=ON", "-DGGML_FMA=ON"} <= set(args)
    assert "-DGGML_AVX_VNNI=ON" not in args  # the CPU lacks avx_vnni: not claimed
    assert cmake_args(set()) == "-DGGML_NATIVE=ON"
