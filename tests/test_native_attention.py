"""The compiled row-invariant attention kernel: the same values as float64 attention, and each row's bits a
function of that row's query and visible keys only (the property greedy losslessness rests on), on every build this
machine runs, for fp32 and bf16."""

import pytest
import torch

from eagle_trt.models.layers import attention_fp64
from eagle_trt.models.native.ops import Attention, attention_fits
from native_support import build_names, lib_or_skip

DTYPES = [torch.float32, torch.bfloat16]


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


@pytest.mark.parametrize("build", build_names())
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("h,hkv,d", [(9, 3, 64), (4, 4, 40), (8, 2, 80), (2, 1, 16)])
def test_matches_float64_attention(build, dtype, h, hkv, d):
    kernel = Attention(lib_or_skip(build))
    q, k, v = _qkv(13, 50, h, hkv, d, dtype, seed=d)
    tol = dict(atol=2e-6, rtol=2e-5) if dtype == torch.float32 else dict(atol=1e-2, rtol=1e-2)
    for mask in (None, _tree_mask(13, 37, seed=h)):
        got = kernel(q, k, v, mask)
        assert got.dtype == dtype and got.shape == (13, h * d)
        torch.testing.assert_close(got.float(), attention_fp64(q, k, v, mask).float(), **tol)


def each_row_alone(kernel, dtype, prefix, t, h=9, hkv=3, d=64) -> bool:
    """A tree row (ancestors at scattered slots among masked siblings, many rows in the call) gives the same bits as
    decoding that token alone over its keys laid out contiguously: the decode-vs-verify invariant."""
    q, k, v = _qkv(t, prefix + t, h, hkv, d, dtype, seed=prefix + t)
    mask = _tree_mask(t, prefix, seed=t)
    full = kernel(q, k, v, mask)
    for row in range(t):
        seen = mask[row].nonzero().flatten()
        if not torch.equal(full[row:row + 1], kernel(q[:, row:row + 1], k[:, seen], v[:, seen], None)):
            return False
    return True


@pytest.mark.parametrize("build", build_names())
@pytest.mark.parametrize("dtype", DTYPES)
def test_each_row_equals_that_row_alone_over_its_visible_keys(build, dtype):
    kernel = Attention(lib_or_skip(build))
    for prefix, t in ((0, 1), (5, 17), (300, 17), (33, 40), (200, 64)):
        assert each_row_alone(kernel, dtype, prefix, t), (prefix, t)


@pytest.mark.parametrize("build", build_names())
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("h,hkv,d", [(4, 4, 40), (8, 2, 80), (2, 1, 16), (4, 2, 128), (6, 2, 48)])
def test_every_head_dim_path_is_row_invariant(build, dtype, h, hkv, d):
    """Scores from K where it is (head_dim a whole number of vectors of the build) or from K transposed (the rest):
    either way, a row's bits do not depend on the call; key counts off the vector width leave a short last block."""
    kernel = Attention(lib_or_skip(build))
    for prefix, t in ((37, 13), (3, 2), (0, 5)):
        assert each_row_alone(kernel, dtype, prefix, t, h, hkv, d), (prefix, t)


@pytest.mark.parametrize("build", build_names())
@pytest.mark.parametrize("dtype", DTYPES)
def test_thread_count_and_strides_change_no_bit(build, dtype):
    kernel = Attention(lib_or_skip(build))
    q, k, v = _qkv(9, 120, 6, 2, 64, dtype, seed=7)
    mask = _tree_mask(9, 111, seed=1)
    # K/V as the cache hands them over: views into a larger [heads, capacity, D] buffer.
    big_k, big_v = torch.zeros(2, 500, 64, dtype=dtype), torch.zeros(2, 500, 64, dtype=dtype)
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


def test_shapes_the_kernel_takes():
    assert attention_fits(128, 2, 64) and not attention_fits(130, 2, 64) and not attention_fits(9, 3, 2048)


@pytest.mark.parametrize("build", build_names())
def test_rejects_bad_input(build):
    kernel = Attention(lib_or_skip(build))
    q, k, v = _qkv(3, 10, 4, 2, 16, torch.float32)
    with pytest.raises(TypeError, match="float32 or bfloat16"):
        kernel(q.half(), k.half(), v.half(), None)
    with pytest.raises(ValueError, match=r"mask must be bool \[3, 10\]"):
        kernel(q, k, v, torch.ones(3, 9, dtype=torch.bool))
