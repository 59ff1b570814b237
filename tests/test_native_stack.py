"""The one-call forwards (models/native/stack.py) on every build this machine runs, fp32 and bf16: a tree-verify
row equals decoding its path alone (logits and EAGLE-3 features, bit for bit), the draft head's layer gives the
torch reference's values, and a KV cache in another dtype takes the reference loop."""

import pytest
import torch

from eagle_trt.models.draft_head import Eagle3DraftHead
from eagle_trt.models.kernel_api import Part
from eagle_trt.models.llama import Rows
from eagle_trt.models.native import stack
from eagle_trt.models.native.kernels import NativeKernels
from eagle_trt.models.reference import TorchKernels
from native_support import build_names, lib_or_skip
from test_gemm import load_target

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# Llama's layer, Qwen3's q/k norms, and Gemma 3's (sliding windows shorter than the prefix plus the tree, so a tree
# row loses early prefix keys and, deep enough, its first ancestors).
FAMILIES = ("llama", "qwen3", "gemma3")


@pytest.fixture
def model_dir(request, tiny_model_dir, family_model_dir):
    return tiny_model_dir if request.param == "llama" else family_model_dir(request.param)


def _kernels(build, dtype):
    return NativeKernels(lib_or_skip(build), dtype, amx=build == "amx" and dtype == torch.bfloat16)


def _tree(rows, seed):
    """Random parents -> (mask [rows, rows] of ancestors and self, depth of each node)."""
    g = torch.Generator().manual_seed(seed)
    parents = [-1] + [int(torch.randint(0, i, (), generator=g)) for i in range(1, rows)]
    mask = torch.eye(rows, dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            mask[i] |= mask[p]
    return mask, mask.sum(1) - 1


@pytest.mark.parametrize("model_dir", FAMILIES, indirect=True)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("build", build_names())
def test_each_tree_row_equals_decoding_its_path(model_dir, build, dtype):
    """Logits and features of every node of a 17-node tree verified in one call, against decoding the node's
    ancestors and then the node one token at a time."""
    target = load_target(model_dir, DTYPES[dtype], _kernels(build, DTYPES[dtype]))
    target.aux_layer_ids = [1, 0, target.spec.num_layers - 1]
    g = torch.Generator().manual_seed(3)
    prefix = torch.randint(0, target.spec.vocab_size, (9,), generator=g)
    ids = torch.randint(0, target.spec.vocab_size, (17,), generator=g)
    mask, depth = _tree(17, seed=4)
    cache = target.new_cache(64)
    target.forward(prefix, torch.arange(9), cache)
    cache.length = 9
    logits, aux = target.forward(ids, 9 + depth, cache, mask, need_aux=True)
    assert aux.shape == (17, 3 * target.spec.hidden_size)
    for node in (0, 5, 11, 16):
        path = mask[node].nonzero().flatten().tolist()  # ancestors, then the node (ascending = root first)
        alone = target.new_cache(64)
        target.forward(prefix, torch.arange(9), alone)
        alone.length = 9
        for j in path:
            row_logits, row_aux = target.forward(ids[j:j + 1], torch.tensor([alone.length]), alone, need_aux=True)
            alone.length += 1
        assert torch.equal(row_logits[0], logits[node]) and torch.equal(row_aux[0], aux[node]), node


def _batched_against_alone(target, cache_dtype=None):
    """Three requests (a 17-node tree after 9 cached tokens, a 1-token step after 5, a 6-token prefill) in one
    batched forward, against each forward alone: (batched, alone) hidden states and features per request, and the
    K/V each wrote."""
    g = torch.Generator().manual_seed(7)
    vocab = target.spec.vocab_size
    mask, depth = _tree(17, seed=5)
    shapes = [(9, torch.randint(0, vocab, (17,), generator=g), 9 + depth, mask),
              (5, torch.randint(0, vocab, (1,), generator=g), torch.tensor([5]), None),
              (0, torch.randint(0, vocab, (6,), generator=g), torch.arange(6), None)]

    def caches():
        out = []
        for prefix, *_ in shapes:
            cache = target.new_cache(40, kv_dtype=cache_dtype)
            if prefix:
                target.forward(torch.arange(prefix) + 11, torch.arange(prefix), cache)
            cache.length = prefix
            out.append(cache)
        return out

    shared = caches()
    h, aux = target.batched_hidden_states([Rows(ids, pos, c, m) for (_, ids, pos, m), c in zip(shapes, shared)],
                                          need_aux=True, aux_layers=[0, target.spec.num_layers - 1])
    alone, row = [], 0
    for (_, ids, pos, m), c_shared, c in zip(shapes, shared, caches()):
        h1, aux1 = target.hidden_states(ids, pos, c, m, need_aux=True, aux_layers=[0, target.spec.num_layers - 1])
        n = ids.numel()
        end = c.length + n
        alone.append(((h[row:row + n], aux[row:row + n], c_shared.k[:, :, :end], c_shared.v[:, :, :end]),
                      (h1, aux1, c.k[:, :, :end], c.v[:, :, :end])))
        row += n
    return alone


@pytest.mark.parametrize("model_dir", FAMILIES, indirect=True)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("build", build_names())
def test_a_request_computes_the_same_in_a_batch_as_alone(model_dir, build, dtype):
    """Row invariance across requests: every request's hidden states, features and K/V in a batched forward are
    bit-identical to its forward alone, whatever else shares the pass."""
    target = load_target(model_dir, DTYPES[dtype], _kernels(build, DTYPES[dtype]))
    for i, (batched, alone) in enumerate(_batched_against_alone(target)):
        for a, b in zip(batched, alone):
            assert torch.equal(a, b), i


@pytest.mark.parametrize("model_dir", FAMILIES, indirect=True)
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_reference_loop_batches_the_same(model_dir, dtype):
    """The torch kernels, and the compiled ones' fallback for an fp8 cache, take parts too: each request as alone
    (bf16 exactly where the kernels are row-invariant, else to rounding)."""
    dt = DTYPES[dtype]
    for target, cache_dtype in ((load_target(model_dir, dt, TorchKernels(dt)), None),
                                (load_target(model_dir, dt), torch.float8_e4m3fn)):
        for batched, alone in _batched_against_alone(target, cache_dtype):
            for a, b in zip(batched, alone):
                if target.row_invariant:
                    assert torch.equal(a, b)
                else:
                    torch.testing.assert_close(a.float(), b.float(), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("family", FAMILIES[1:])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("build", build_names())
def test_the_stack_gives_the_torch_reference_values(family_model_dir, family, build, dtype):
    """Qwen3's and Gemma 3's layers in one compiled call against the torch reference: a prefill past the window and
    a tree after it, logits and every feature layer up to rounding (the reference sums in other orders)."""
    dt = DTYPES[dtype]
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 260, (14,), generator=g)
    mask, depth = _tree(9, seed=6)
    outs = []
    for kernels in (_kernels(build, dt), TorchKernels(dt)):
        target = load_target(family_model_dir(family), dt, kernels)
        cache = target.new_cache(32)
        first, aux0 = target.forward(ids, torch.arange(14), cache, need_aux=True, aux_layers=list(range(8)))
        cache.length = 14
        tree, aux1 = target.forward(ids[:9], 14 + depth, cache, mask, need_aux=True, aux_layers=list(range(8)))
        outs.append((first, aux0, tree, aux1))
    for a, b in zip(*outs):
        # bf16 through 8 layers: each side rounds its sums differently (the reference's bf16 products depend on the
        # CPU's library path), so the error scales with the tensor's largest value, a few bf16 steps of it.
        tol = dict(atol=2e-4, rtol=1e-4) if dt == torch.float32 else dict(atol=0.025 * float(b.float().abs().max()),
                                                                            rtol=0.05)
        torch.testing.assert_close(a.float(), b.float(), **tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("build", build_names())
def test_a_cache_in_another_dtype_takes_the_reference_loop(tiny_model_dir, build, dtype):
    dt = DTYPES[dtype]
    target = load_target(tiny_model_dir, dt, _kernels(build, dt))
    other = torch.bfloat16 if dt == torch.float32 else torch.float32
    ids = torch.arange(12) + 3
    want, _ = target.forward(ids, torch.arange(12), target.new_cache(16))
    got, _ = target.forward(ids, torch.arange(12), target.new_cache(16, kv_dtype=other))
    torch.testing.assert_close(got.float(), want.float(), atol=0.1, rtol=0.05)


@pytest.mark.parametrize("build", build_names())
def test_stack_checks_its_input(tiny_model_dir, build):
    target = load_target(tiny_model_dir, torch.bfloat16, _kernels(build, torch.bfloat16))
    table = target._weights.table
    cache = target.new_cache(4)
    cos, sin = target.rope.tables(torch.arange(2))
    x = target.embed[torch.tensor([1, 2])]
    lib, spec = target.kernels.lib, target.spec
    def run(x, *parts):
        return stack.decoder_stack(lib, table, spec=spec, x=x, cos=cos, sin=sin, parts=list(parts), aux_layers=[])

    with pytest.raises(RuntimeError, match="KV cache full: need 5 slots, capacity 4"):
        run(x, Part(cache, 3, 2, torch.ones(2, 5, dtype=torch.bool)))
    with pytest.raises(ValueError, match=r"mask must be bool \[2, 2\]"):
        run(x, Part(cache, 0, 2, torch.ones(2, 3, dtype=torch.bool)))
    with pytest.raises(TypeError, match="contiguous torch.bfloat16 input"):
        run(x.float(), Part(cache, 0, 2, torch.ones(2, 2, dtype=torch.bool)))
    with pytest.raises(ValueError, match="the parts hold 1 rows, the input 2"):
        run(x, Part(cache, 0, 1))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("build", build_names())
@pytest.mark.parametrize("last_only", [False, True])
def test_draft_layer_matches_the_torch_reference(tiny_model_dir, tiny_head_dir, build, dtype, last_only):
    """The head in one compiled call: the reference's values up to rounding (its attention is the compiled kernel,
    not torch's), the same K/V written, the caller's features untouched."""
    dt = DTYPES[dtype]
    g = torch.Generator().manual_seed(1)
    feats = torch.randn(7, 64, generator=g).to(dt)
    ids = torch.randint(0, 260, (7,), generator=g)
    mask = torch.ones(4, 7, dtype=torch.bool).tril_(diagonal=3)
    mask[3, 4] = False  # a tree row that does not see a sibling
    outs = []
    for kernels in (_kernels(build, dt), TorchKernels(dt)):
        head = Eagle3DraftHead.load(tiny_head_dir, load_target(tiny_model_dir, dt, kernels), dt)
        assert head.kernels is kernels
        cache = head.new_cache(16)
        head.forward(feats[:3], ids[:3], torch.arange(3), cache, 0)
        before = feats.clone()
        logits, out = head.forward(feats[3:], ids[3:], torch.tensor([3, 4, 4, 5]), cache, 3, mask, last_only)
        assert torch.equal(feats, before)
        outs.append((logits, out, cache.k[:, :, :7].clone(), cache.v[:, :, :7].clone()))
    assert outs[0][0].shape == ((1 if last_only else 4), 260)
    tol = dict(atol=1e-4, rtol=1e-4) if dt == torch.float32 else dict(atol=0.05, rtol=0.02)
    for a, b in zip(*outs):
        torch.testing.assert_close(a.float(), b.float(), **tol)
