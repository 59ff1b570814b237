"""The bit-identity tests catch what they are there to catch: kernels built with one row's accumulation order
perturbed (the last row of a many-row call sums in another order: csrc `EAGLE_TRT_MUTATE_GEMM`, `_ATTENTION`,
`_NORM`) fail them.

In fp32 every such perturbation shows, at model and kernel level. In bf16 the outputs' rounding to 8 bits hides
a perturbed fp32 sum in all but about one element in 10^4 (measured: 0 of 576 elements of a perturbed attention row
changed), so a bf16 check sees it only over many elements: the projections' kernel-level check does. The bf16 and
fp32 kernels share their accumulation code (csrc/simd.h, Elem), so the fp32 checks cover the orders of both."""

import pytest
import torch

from eagle_trt.models.native import bindings, build, ops
from eagle_trt.models.native.kernels import NativeKernels
from eagle_trt.models.native.gemm import NativeProjection
from eagle_trt.models.native.ops import Attention
from native_support import builds
from test_gemm import load_target, verify_equals_decode
from test_native_attention import each_row_alone
from test_native_gemm import _each_row_alone

pytestmark = pytest.mark.skipif(not builds(), reason="no native kernels here: nothing to mutate")
MUTATIONS = ("GEMM", "ATTENTION", "NORM")


@pytest.fixture(scope="module")
def mutants(tmp_path_factory):
    """{mutation: Library} built with that mutation defined (this machine's ISA, vector projections)."""
    out = {}
    mp = pytest.MonkeyPatch()
    try:
        for name in MUTATIONS:
            mp.setenv("EAGLE_TRT_CXXFLAGS", f"-DEAGLE_TRT_MUTATE_{name}")
            out[name] = bindings.Library(build.build(out_dir=tmp_path_factory.mktemp("mutant")))
    finally:
        mp.undo()
    return out


@pytest.mark.parametrize("mutation", MUTATIONS)
def test_a_perturbed_row_fails_verify_equals_decode(tiny_model_dir, mutants, mutation):
    fp32 = torch.float32
    for seed in range(3):
        assert not verify_equals_decode(load_target(tiny_model_dir, fp32, NativeKernels(mutants[mutation], fp32)),
                                        seed)
    # The same check passes on the unmutated build of the same ISA.
    clean = next(iter(builds().values()))
    assert verify_equals_decode(load_target(tiny_model_dir, fp32, NativeKernels(clean, fp32)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_projections_row_check_catches_it(mutants, dtype):
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(576, 600, generator=g).to(dtype), torch.randn(70, 576, generator=g).to(dtype)
    with pytest.raises(AssertionError):
        _each_row_alone(NativeProjection(mutants["GEMM"], w), x)


def test_the_attention_and_norm_row_checks_catch_it(mutants):
    assert not each_row_alone(Attention(mutants["ATTENTION"]), torch.float32, 33, 17)
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(9, 576, generator=g), torch.randn(576, generator=g)
    lib = mutants["NORM"]
    together = ops.add_rms_norm(lib, x.clone(), None, w, 1e-5)
    alone = torch.cat([ops.add_rms_norm(lib, x[i:i + 1].clone(), None, w, 1e-5) for i in range(9)])
    assert torch.equal(together[:8], alone[:8]) and not torch.equal(together[8], alone[8])


def test_the_block_projections_checks_catch_it(tiny_model_dir, mutants):
    """The block kernel under the same define sums the last row's lanes in another order: its row check and a block
    target's verify-equals-decode both fail; the clean build passes them (tests/test_native_blocks.py,
    test_block_forward.py)."""
    from eagle_trt.models import block_weights
    from eagle_trt.models.native.block_gemm import BlockProjection
    from test_block_forward import block_target

    g = torch.Generator().manual_seed(0)
    w = block_weights.quantize(torch.randn(96, 512, generator=g), "q4_0")
    x = torch.randn(9, 512, generator=g)
    proj = BlockProjection(mutants["GEMM"], w)
    together = proj(x)
    alone = torch.cat([proj(x[i:i + 1]) for i in range(9)])
    assert torch.equal(together[:8], alone[:8]) and not torch.equal(together[8], alone[8])
    fp32 = torch.float32
    assert not verify_equals_decode(block_target(tiny_model_dir, fp32, NativeKernels(mutants["GEMM"], fp32), "q8_0"))


@pytest.mark.parametrize("path", ["vector", "tiles"])
@pytest.mark.parametrize("fmt", ["q8_0", "q4_0", "q4_1", "q5_0", "q4_k", "q6_k"])
def test_the_int8_block_projections_checks_catch_it(tiny_model_dir, mutants, fmt, path):
    """The int8 block kernel under the same define rounds the last row's block step apart (product, then sum): its
    row check fails for every format, on the vector path and on the AMX-INT8 tiles (where the CPU has them), and so
    does an int8 block target's verify-equals-decode."""
    from eagle_trt.models.native.block_gemm import BlockProjection
    from test_block_forward import block_target
    from test_native_blocks import random_blocks

    lib = mutants["GEMM"]
    if path == "tiles" and not lib.int8_amx():
        pytest.skip("no AMX-INT8 here: the vector path takes every call")
    before = lib.int8_set_amx_rows(2 if path == "tiles" else 1 << 40)
    try:
        w = random_blocks(fmt, 96, 512, seed=0)
        x = torch.randn(9, 512, generator=torch.Generator().manual_seed(1))
        proj = BlockProjection(lib, w, "int8")
        together = proj(x)
        alone = torch.cat([proj(x[i:i + 1]) for i in range(9)])
    finally:
        lib.int8_set_amx_rows(before)
    assert torch.equal(together[:8], alone[:8]) and not torch.equal(together[8], alone[8])
    if fmt == "q4_0":
        fp32 = torch.float32
        kernels = NativeKernels(mutants["GEMM"], fp32, block_compute="int8")
        assert not verify_equals_decode(block_target(tiny_model_dir, fp32, kernels, "q4_0"))
