"""A GGUF's data region damaged, through `convert --head`, `build` (weights: auto: the file's own blocks reach the C++
kernels) and a 4-token `run`: flipped bytes in block data, non-finite block scales, a tensor's type id swapped to a
larger type, misaligned and overlapping tensor offsets.

Invariant for every case: each command either succeeds or fails with the project's own error (exit 2, one line on
stderr, no traceback), within a time limit, without the process dying (a segfault in a kernel); when all three
succeed, the 4 tokens come and the engine's target gives finite logits for the prompt. Flipped quant bits are legal
data (success is fine); a non-finite scale, a swapped type id, a misaligned or an overlapping offset must be refused
at convert, naming the tensor.

Each case runs in a child forked from a server that has imported the CLI, transformers and the kernels once
(`gguf_fuzz_worker.py`), so a crash ends that child only. The cases are drawn from a seeded generator: the same inputs
every run. `make test` runs CASES of them (one test each, ~1.5 s a case after the server's start); the long run,
`pytest -m fuzz_long tests/test_fuzz_gguf_data.py`, LONG_CASES more.
"""

from __future__ import annotations

import collections
import json
import multiprocessing
import os
import random
import shutil
import struct
from pathlib import Path

import pytest

import gguf_support
from eagle_trt.convert.gguf_file import GGML_TYPES

CASES = int(os.environ.get("EAGLE_TRT_FUZZ_GGUF_CASES", "32"))
LONG_CASES = int(os.environ.get("EAGLE_TRT_FUZZ_GGUF_LONG_CASES", "300"))
CASE_SECONDS = 90  # one case's three commands; a hang is a failure, not a wait
# Bit patterns of non-finite fp16 scales: +inf, -inf, a quiet NaN, a NaN with payload.
NONFINITE_F16 = (0x7C00, 0xFC00, 0x7E00, 0x7D01)
# A tensor's scale fields per ggml type (the fp16 d / dmin of each block), as offsets in a block.
SCALES = {"Q8_0": (0,), "Q4_0": (0,), "Q5_0": (0,), "Q4_1": (0, 2), "Q5_1": (0, 2), "Q4_K": (0, 2),
          "Q5_K": (0, 2), "Q6_K": (208,)}


OUTCOMES: collections.Counter = collections.Counter()  # (kind, outcome) -> cases, printed at the end (-s)


@pytest.fixture(scope="module", autouse=True)
def tally():
    yield
    if OUTCOMES:
        print("\nGGUF data fuzz:", ", ".join(f"{k} {o}: {n}" for (k, o), n in sorted(OUTCOMES.items())))


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """(the undamaged GGUF's bytes, its tensor layout, the head dir, a dir for the cases)."""
    root = tmp_path_factory.mktemp("gguf-fuzz")
    data = gguf_support.write_model_gguf(root / "base.gguf").read_bytes()
    return data, gguf_support.tensor_layout(data), gguf_support.write_head(root / "head"), root


@pytest.fixture(scope="module")
def server():
    """A forkserver that has imported gguf_fuzz_worker: each case forks from it."""
    tests = str(Path(__file__).parent)
    saved = os.environ.get("PYTHONPATH")
    # The server imports its preload before it learns the parent's sys.path: PYTHONPATH names this dir to it.
    os.environ["PYTHONPATH"] = tests + (os.pathsep + saved if saved else "")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["gguf_fuzz_worker"])
    import gguf_fuzz_worker

    try:
        # starts the server (its imports) outside any case's limit, and proves it preloaded the worker
        warm = ctx.Process(target=gguf_fuzz_worker.check_preloaded)
        warm.start()
        warm.join()
        assert warm.exitcode == 0, "the fork server did not import gguf_fuzz_worker: every case would import it anew"
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
    return ctx, gguf_fuzz_worker.run_case


# ---- the damage ------------------------------------------------------------------------------------------------
# Each takes (the bytes as a bytearray, the layout, the tensor names, the generator), damages the bytes in place and
# says what it did, the tensor it damaged first.

def _flip(raw, layout, names, rng) -> str:
    """Bytes anywhere in one tensor's data (quant bits, scales, float values) XORed with random bits."""
    e = layout[rng.choice(names)]
    flips = sorted(rng.randrange(e.nbytes) for _ in range(rng.randint(1, 8)))
    for at in flips:
        raw[e.data_at + at] ^= rng.randint(1, 255)
    return f"{e.name}: bytes {flips} flipped"


def _bits(raw, layout, names, rng) -> str:
    """Bytes of one quantized tensor's blocks other than its fp16 scales (the quants, q6_k's int8 sub-scales)
    XORed with random bits: legal data, which must run."""
    e = layout[rng.choice([n for n in names if _type(layout[n]) in SCALES])]
    size, fields = GGML_TYPES[e.ggml_type][2], SCALES[_type(e)]
    free = [i for i in range(size) if not any(f <= i < f + 2 for f in fields)]
    flips = sorted(size * rng.randrange(e.nbytes // size) + rng.choice(free) for _ in range(rng.randint(1, 64)))
    for at in flips:
        raw[e.data_at + at] ^= rng.randint(1, 255)
    return f"{e.name}: {len(flips)} quant bytes flipped"


def _scale(raw, layout, names, rng) -> str:
    """One block's fp16 scale (or one float value) made inf, -inf or NaN."""
    e = layout[rng.choice([n for n in names if _type(layout[n]) in SCALES or _type(layout[n]) in ("F32", "F16")])]
    size, bits = GGML_TYPES[e.ggml_type][2], rng.choice(NONFINITE_F16)
    at = e.data_at + size * rng.randrange(e.nbytes // size) + rng.choice(SCALES.get(_type(e), (0,)))
    if _type(e) == "F32":
        raw[at:at + 4] = struct.pack("<f", (float("inf"), float("-inf"), float("nan"))[bits % 3])
    else:
        raw[at:at + 2] = struct.pack("<H", bits)
    return f"{e.name}: a non-finite value at byte {at - e.data_at}"


def _swap_type(raw, layout, names, rng) -> str:
    """One tensor's ggml type id in the header replaced by a type of more bytes per weight."""
    e = layout[rng.choice(names)]
    _, n, b = GGML_TYPES[e.ggml_type]
    new = rng.choice([t for t, (_, tn, tb) in GGML_TYPES.items() if tb * n > b * tn])
    struct.pack_into("<I", raw, e.type_at, new)
    return f"{e.name}: type {_type(e)} -> {GGML_TYPES[new][0]}"


def _misalign(raw, layout, names, rng) -> str:
    """One tensor's data offset moved by 1-31 bytes (the file's alignment is 32)."""
    e = layout[rng.choice(names)]
    offset = e.offset + rng.randint(1, 31)
    struct.pack_into("<Q", raw, e.offset_at, offset)
    return f"{e.name}: offset {e.offset} -> {offset}"


def _overlap(raw, layout, names, rng) -> str:
    """One tensor's data offset moved onto another tensor: its start, or an aligned place inside it."""
    e = layout[rng.choice(names)]
    other = layout[rng.choice([n for n in names if n != e.name])]
    offset = other.offset + 32 * rng.randrange(max(1, other.nbytes // 32))
    struct.pack_into("<Q", raw, e.offset_at, offset)
    return f"{e.name}: offset {e.offset} -> {offset}"


def _type(e) -> str:
    return GGML_TYPES[e.ggml_type][0]


DAMAGE = {"flip": _flip, "bits": _bits, "scale": _scale, "type": _swap_type, "misalign": _misalign,
          "overlap": _overlap}
# The order cases cycle through: half of them reach the kernels (flip, bits), half are refused at convert.
KINDS = ("flip", "scale", "bits", "type", "flip", "misalign", "bits", "overlap")
REFUSED = {"scale", "type", "misalign", "overlap"}  # damage that must never pass convert
MUST_RUN = {"bits"}  # legal data: convert, build and run must all succeed


def make_case(index: int, base) -> tuple[str, bytes, str]:
    """Case `index`: (its kind, the damaged bytes, what was done); the same every run."""
    data, layout, _, _ = base
    kind = KINDS[index % len(KINDS)]
    raw = bytearray(data)
    what = DAMAGE[kind](raw, layout, sorted(layout), random.Random(f"gguf-fuzz {index}"))
    return kind, bytes(raw), what


# ---- one case through the three commands ---------------------------------------------------------------------------

def run_case(server, base, index: int) -> str | None:
    """None when case `index` keeps the invariant, else what broke it."""
    ctx, target = server
    _, _, head, root = base
    kind, data, what = make_case(index, base)
    case_dir = root / f"case-{index}"
    case_dir.mkdir()
    (case_dir / "m.gguf").write_bytes(data)
    p = ctx.Process(target=target, args=(str(case_dir), str(head)))
    p.start()
    p.join(CASE_SECONDS)
    if p.is_alive():
        p.kill()
        p.join()
        return f"case {index} ({kind}, {what}): no answer within {CASE_SECONDS} s"
    if p.exitcode != 0:
        return f"case {index} ({kind}, {what}): the process ended with exit code {p.exitcode} (negative: the signal)"
    result = json.loads((case_dir / "result.json").read_text())
    last = result["steps"][-1]
    OUTCOMES[kind, "ran" if last["exit"] == 0 else f"refused at {last['step']}"] += 1
    problem = judge(result, kind, what)
    if problem is None:
        shutil.rmtree(case_dir)  # a checkpoint and an engine a case: kept only where one fails
        return None
    return f"case {index} ({kind}, {what}): {problem}"


def judge(result: dict, kind: str, what: str) -> str | None:
    """What is wrong with a case's result (see the module doc), or None."""
    for s in result["steps"]:
        if s["unexpected"] or s["exit"] not in (0, 2):
            return f"{s['step']} exited {s['exit']}: {s['unexpected'] or s['stderr']}"
        if s["exit"] == 2:
            lines = s["stderr"].strip().splitlines()
            if not lines[-1].startswith("Error: ") or "Traceback" in s["stderr"]:
                return f"{s['step']}'s error is not one line: {s['stderr']!r}"
            if kind in MUST_RUN:
                return f"legal data refused at {s['step']}: {lines[-1]!r}"
            if kind in REFUSED and (s["step"] != "convert" or what.split(":")[0] not in lines[-1]):
                return f"refused at {s['step']} without naming the tensor: {lines[-1]!r}"
            return None
    if kind in REFUSED:
        return "damage that must be refused passed convert, build and run"
    whole = len(result["tokens"]) == 4 or (result["tokens"] and result["stop_reason"] != "length")  # or its EOS
    if not whole or result["finite"] is not True:
        return f"run gave tokens {result['tokens']}, finite logits: {result['finite']}"
    return None


@pytest.mark.parametrize("index", range(CASES))
def test_damaged_gguf_data(server, base, index):
    problem = run_case(server, base, index)
    assert problem is None, problem


@pytest.mark.fuzz_long
def test_damaged_gguf_data_long(request, server, base):
    """LONG_CASES more cases (after the CASES above), every failure listed."""
    if "fuzz_long" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("the long run: pytest -m fuzz_long tests/test_fuzz_gguf_data.py")
    problems = [p for i in range(CASES, CASES + LONG_CASES) if (p := run_case(server, base, i)) is not None]
    assert not problems, f"{len(problems)} of {LONG_CASES} cases broke the invariant:\n" + "\n".join(problems)


def test_the_undamaged_file_runs(server, base):
    """The harness itself: the file the cases damage goes through all three commands to finite logits."""
    data, _, head, root = base
    case_dir = root / "clean"
    case_dir.mkdir()
    (case_dir / "m.gguf").write_bytes(data)
    ctx, target = server
    p = ctx.Process(target=target, args=(str(case_dir), str(head)))
    p.start()
    p.join(CASE_SECONDS)
    assert p.exitcode == 0
    result = json.loads((case_dir / "result.json").read_text())
    assert [s["exit"] for s in result["steps"]] == [0, 0, 0], result
    assert result["tokens"] and result["finite"] is True
