"""The lossless assertion the tests use (tests/lossless_support.py) fails where it must: any difference on
row-invariant kernels, and a difference at a decided token (not a near-tie) on kernels that are not row-invariant."""

from __future__ import annotations

import pytest
import torch

from eagle_trt.models.reference import TorchKernels
from eagle_trt.config.decode import DecodeConfig
from eagle_trt.runtime.runner import Runner
from lossless_support import assert_lossless, top_two_gap
from test_gemm import load_target

PROMPT = [5, 6, 7, 8, 9]


def plain(target, n=12):
    return Runner(target, None, capacity=256).generate(PROMPT, DecodeConfig(max_new_tokens=n, mode="ar",
                                                                            eos_token_ids=[])).token_ids


def test_equal_outputs_pass_on_any_backend(tiny_model_dir):
    target = load_target(tiny_model_dir, torch.float32, TorchKernels(torch.float32))
    ar = plain(target)
    assert_lossless(target, PROMPT, list(ar), ar)


def test_a_changed_token_fails_on_row_invariant_kernels(tiny_model_dir):
    target = load_target(tiny_model_dir, torch.float32)
    if not target.row_invariant:
        pytest.skip("no row-invariant kernels on this machine")
    ar = plain(target)
    with pytest.raises(AssertionError, match="row-invariant kernels"):
        assert_lossless(target, PROMPT, ar[:5] + [(ar[5] + 1) % 260] + ar[6:], ar)


def test_a_decided_token_that_differs_fails_on_the_torch_reference(tiny_model_dir):
    target = load_target(tiny_model_dir, torch.float32, TorchKernels(torch.float32))
    assert not target.row_invariant
    ar = plain(target)
    gap, _ = top_two_gap(target, PROMPT + ar[:5])
    assert gap > 1e-3  # a random tiny model's tokens are decided by far more than rounding
    with pytest.raises(AssertionError, match="not a near-tie"):
        assert_lossless(target, PROMPT, ar[:5] + [(ar[5] + 1) % 260] + ar[6:], ar)
    with pytest.raises(AssertionError, match="lengths differ"):
        assert_lossless(target, PROMPT, ar[:-1], ar)
