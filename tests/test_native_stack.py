"""The decoder stack in one compiled call (models/native_stack.py): the same bits as the layer loop it replaces."""

import pytest
import torch

from eagle_trt.models import native_stack
from eagle_trt.models.llama import LlamaTarget

BF = torch.bfloat16


def _target(tiny_model_dir):
    target = LlamaTarget.load(tiny_model_dir, dtype=BF)
    if target.stack is None:
        pytest.skip("no AMX projections or no C++ compiler here: the layer loop serves every bf16 forward")
    return target


def _forward(target, use_stack, ids, positions, prefix, tree_mask, need_aux):
    stack = target.stack
    if not use_stack:
        target.stack = None
    try:
        cache = target.new_cache(64)
        target.forward(prefix, torch.arange(prefix.numel()), cache)
        cache.length = prefix.numel()
        logits, aux = target.forward(ids, positions, cache, tree_mask, need_aux=need_aux)
        return logits, aux, cache.k.clone(), cache.v.clone()
    finally:
        target.stack = stack


@pytest.mark.parametrize("rows", [1, 5, 17, 40])
@pytest.mark.parametrize("aux", [[], [0], [1, 0], [0, 1]])
def test_stack_equals_the_layer_loop_bit_for_bit(tiny_model_dir, rows, aux):
    """Logits, EAGLE-3 features (any aux order, the last layer included) and every cache entry, under a tree mask."""
    target = _target(tiny_model_dir)
    target.aux_layer_ids = aux
    g = torch.Generator().manual_seed(rows)
    prefix = torch.randint(0, target.spec.vocab_size, (9,), generator=g)
    ids = torch.randint(0, target.spec.vocab_size, (rows,), generator=g)
    parents = [-1] + [int(torch.randint(0, i, (), generator=g)) for i in range(1, rows)]
    mask = torch.eye(rows, dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            mask[i] |= mask[p]
    depth = mask.sum(1) - 1
    outs = [_forward(target, s, ids, 9 + depth, prefix, mask if rows > 1 else None, bool(aux)) for s in (True, False)]
    for a, b in zip(*outs):
        assert (a is None) == (b is None)
        if a is not None:
            assert torch.equal(a, b)
    if aux:  # the features are the listed layers' outputs, in layer order
        assert outs[0][1].shape == (rows, len(aux) * target.spec.hidden_size)


def test_stack_turns_off(tiny_model_dir, monkeypatch):
    monkeypatch.setenv("EAGLE_TRT_STACK", "0")
    assert native_stack.load() is None
    assert LlamaTarget.load(tiny_model_dir, dtype=BF).stack is None


def test_stack_checks_its_input(tiny_model_dir):
    target = _target(tiny_model_dir)
    cache = target.new_cache(4)
    cos, sin = target.rope.tables(torch.arange(2))
    x = target.embed[torch.tensor([1, 2])]
    with pytest.raises(RuntimeError, match="KV cache full: need 5 slots, capacity 4"):
        target.stack(target._stack_weights, target.spec, x, cos, sin, cache.k, cache.v, 3, None, [])
    with pytest.raises(ValueError, match=r"mask must be bool \[2, 2\]"):
        target.stack(target._stack_weights, target.spec, x, cos, sin, cache.k, cache.v, 0,
                     torch.ones(2, 3, dtype=torch.bool), [])
    with pytest.raises(TypeError, match="contiguous bf16 input"):
        target.stack(target._stack_weights, target.spec, x.float(), cos, sin, cache.k, cache.v, 0, None, [])


@pytest.mark.parametrize("last_only", [False, True])
def test_draft_layer_matches_the_head_s_operators(tiny_model_dir, tiny_head_dir, last_only):
    """The head in one compiled call: the operator path's values up to bf16 rounding (its attention is the compiled
    kernel, not torch's), the same K/V written, the caller's features untouched."""
    from eagle_trt.models.draft_head import Eagle3DraftHead

    target = _target(tiny_model_dir)
    head = Eagle3DraftHead.load(tiny_head_dir, target, BF)
    assert head.layer is not None
    g = torch.Generator().manual_seed(1)
    feats = torch.randn(7, target.spec.hidden_size, generator=g).to(BF)
    ids = torch.randint(0, target.spec.vocab_size, (7,), generator=g)
    mask = torch.ones(4, 7, dtype=torch.bool).tril_(diagonal=3)
    mask[3, 4] = False  # a tree row that does not see a sibling
    outs = []
    for layer in (head.layer, None):
        head.layer = layer
        cache = head.new_cache(16)
        head.forward(feats[:3], ids[:3], torch.arange(3), cache, 0)
        before = feats.clone()
        logits, out = head.forward(feats[3:], ids[3:], torch.tensor([3, 4, 4, 5]), cache, 3, mask, last_only)
        assert torch.equal(feats, before)
        outs.append((logits, out, cache.k[:, :, :7].clone(), cache.v[:, :, :7].clone()))
    assert outs[0][0].shape == ((1 if last_only else 4), head.lm_head.w.shape[1])
    for a, b in zip(*outs):
        torch.testing.assert_close(a.float(), b.float(), atol=0.05, rtol=0.02)


def test_top_logp_is_torch_s_log_softmax_top_k(tiny_model_dir, tiny_head_dir):
    """Drafting's top-k in one compiled pass: torch's ids and, to float rounding, its log-probs; ties to the earlier
    id; k above the vocabulary gives the whole row."""
    from eagle_trt.models.draft_head import Eagle3DraftHead

    head = Eagle3DraftHead.load(tiny_head_dir, _target(tiny_model_dir), BF)
    g = torch.Generator().manual_seed(5)
    # Distinct integers (exact in bf16), so torch's order is defined; then a planted tie.
    logits = torch.stack([torch.randperm(250, generator=g) - 125 for _ in range(4)]).to(BF) / 16
    logits[2, 200] = logits[2, 30] = logits[2].max() + 1  # a tie for the top: 30 first
    for k in (1, 2, 8):
        vals, idx = head.top_logp(logits, k)
        want_vals, want_idx = torch.log_softmax(logits.float(), -1).topk(k, dim=-1)
        torch.testing.assert_close(vals, want_vals, atol=1e-5, rtol=1e-5)
        assert torch.equal(idx[[0, 1, 3]], want_idx[[0, 1, 3]])
        assert int(idx[2, 0]) == 30 and (k == 1 or int(idx[2, 1]) == 200)
    vals, idx = head.top_logp(logits[:, :5], 9)
    assert vals.shape == (4, 5) and sorted(idx[0].tolist()) == [0, 1, 2, 3, 4]
    torch.testing.assert_close(vals.exp().sum(-1), torch.ones(4), atol=1e-3, rtol=0)


def test_a_swapped_attention_takes_the_layer_loop(tiny_model_dir):
    """The stack calls the compiled attention itself: a target whose attention was replaced runs its layer loop."""
    target = _target(tiny_model_dir)
    calls = []
    kernel = target.attend

    def counted(q, k, v, mask):
        calls.append(q.shape[1])
        return kernel(q, k, v, mask)

    target.attend = counted
    target.forward(torch.tensor([3, 4]), torch.arange(2), target.new_cache(8))
    assert calls == [2] * target.spec.num_layers
