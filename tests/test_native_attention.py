"""The compiled row-invariant attention kernel: the same values as float64 attention, and each row's bits a
function of that row's query and visible keys only (the property greedy losslessness rests on)."""

import os
import subprocess
import sys

import pytest
import torch

from eagle_trt.models import native, native_attention
from eagle_trt.models.layers import attention_fp64
from eagle_trt.models.llama import pick_attention

kernel = native_attention.load()
needs_kernel = pytest.mark.skipif(kernel is None, reason="no C++ compiler: the engine uses float64 attention here")


def _qkv(t, s, h, hkv, d, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g).to(dtype) for shape in ((h, t, d), (hkv, s, d), (hkv, s, d))]


def _tree_mask(t, prefix, seed):
    """[t, prefix + t]: prefix visible; each tree row sees a random ancestor chain and itself."""
    g = torch.Generator().manual_seed(seed)
    parent = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, t)]
    mask = torch.zeros(t, prefix + t, dtype=torch.bool)
    mask[:, :prefix] = True
    for i in range(t):
        j = i
        while j >= 0:
            mask[i, prefix + j] = True
            j = parent[j]
    return mask


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("h,hkv,d", [(9, 3, 64), (4, 4, 40), (8, 2, 80), (2, 1, 16)])
def test_matches_float64_attention(dtype, h, hkv, d):
    q, k, v = _qkv(13, 50, h, hkv, d, dtype, seed=d)
    tol = dict(atol=2e-6, rtol=2e-5) if dtype == torch.float32 else dict(atol=1e-2, rtol=1e-2)
    for mask in (None, _tree_mask(13, 37, seed=h)):
        got = kernel(q, k, v, mask)
        assert got.dtype == dtype and got.shape == (13, h * d)
        torch.testing.assert_close(got.float(), attention_fp64(q, k, v, mask).float(), **tol)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("prefix,t", [(0, 1), (5, 17), (300, 17), (33, 40), (200, 64)])
def test_each_row_equals_that_row_alone_over_its_visible_keys(dtype, prefix, t):
    """A tree row (ancestors at scattered slots among masked siblings, many rows in the call) gives the same
    bits as decoding that token alone over its keys laid out contiguously: the decode-vs-verify invariant."""
    q, k, v = _qkv(t, prefix + t, 9, 3, 64, dtype, seed=prefix + t)
    mask = _tree_mask(t, prefix, seed=t)
    full = kernel(q, k, v, mask)
    for row in range(t):
        seen = mask[row].nonzero().flatten()
        alone = kernel(q[:, row:row + 1], k[:, seen], v[:, seen], None)
        assert torch.equal(full[row:row + 1], alone), row


@needs_kernel
def test_thread_count_and_strides_change_no_bit():
    q, k, v = _qkv(9, 120, 6, 2, 64, torch.bfloat16, seed=7)
    mask = _tree_mask(9, 111, seed=1)
    # K/V as the cache hands them over: views into a larger [heads, capacity, D] buffer.
    big_k = torch.zeros(2, 500, 64, dtype=torch.bfloat16)
    big_v = torch.zeros(2, 500, 64, dtype=torch.bfloat16)
    big_k[:, :120], big_v[:, :120] = k, v
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = kernel(q, k, v, mask)
        torch.set_num_threads(2)
        two = kernel(q, big_k[:, :120], big_v[:, :120], mask)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)


@needs_kernel
def test_a_head_layout_the_kernel_does_not_take_falls_back(tiny_model_dir):
    import dataclasses

    from eagle_trt.models.llama import LlamaTarget

    spec = LlamaTarget.load(tiny_model_dir, dtype=torch.bfloat16).spec
    cpu = torch.device("cpu")
    assert pick_attention(torch.bfloat16, cpu, spec) is kernel
    assert pick_attention(torch.bfloat16, cpu, dataclasses.replace(spec, head_dim=2048)) is attention_fp64
    assert kernel.supports(128, 2, 64) and not kernel.supports(130, 2, 64)


@needs_kernel
def test_rejects_bad_input():
    q, k, v = _qkv(3, 10, 4, 2, 16, torch.float32)
    with pytest.raises(TypeError, match="float32 or bfloat16"):
        kernel(q.half(), k.half(), v.half(), None)
    with pytest.raises(ValueError, match=r"mask must be bool \[3, 10\]"):
        kernel(q, k, v, torch.ones(3, 9, dtype=torch.bool))


def test_build_reports_the_compiler_error(tmp_path, monkeypatch):
    monkeypatch.setattr(native, "_compiler", lambda: None)
    with pytest.raises(RuntimeError, match=r"no C\+\+ compiler found \(set CXX, or install g\+\+\)"):
        native.build(out_dir=tmp_path)
    bogus = tmp_path / "cxx"
    bogus.write_text("#!/bin/sh\necho 'cxx: cannot build' >&2\nexit 1\n")
    bogus.chmod(0o755)
    with pytest.raises(RuntimeError, match="cannot build"):
        native.build(compiler=str(bogus), out_dir=tmp_path / "k")
    assert not list((tmp_path / "k").glob("*.so*"))  # nothing half-written left behind


def test_disabled_falls_back_to_float64(tmp_path):
    """EAGLE_TRT_NATIVE=0 (or no compiler): bf16 uses float64 attention and torch's row ops; fp32 always the fused
    attention kernel."""
    code = ("import torch; from eagle_trt.models.llama import pick_attention; "
            "from eagle_trt.models.layers import attention, attention_fp64; "
            "cpu = torch.device('cpu'); "
            "assert pick_attention(torch.bfloat16, cpu) is attention_fp64; "
            "assert pick_attention(torch.float32, cpu) is attention; "
            "from eagle_trt.models import native_ops; assert native_ops.load() is None; print('ok')")
    env = dict(os.environ, EAGLE_TRT_NATIVE="0", EAGLE_TRT_CACHE=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr
    assert not (tmp_path / "kernels").exists()  # disabled: nothing compiled


@needs_kernel
def test_kernel_is_cached_per_source_and_cpu(tmp_path):
    first = native.build(out_dir=tmp_path)
    mtime = first.stat().st_mtime_ns
    assert native.build(out_dir=tmp_path) == first and first.stat().st_mtime_ns == mtime
    assert pick_attention(torch.bfloat16, torch.device("cpu")) is kernel
