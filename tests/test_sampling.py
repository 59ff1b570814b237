"""Speculative sampling leaves the target distribution unchanged (chi-square against the exact p).

Pure-function checks on hand-made trees (fast, many draws), a mutation test that a broken residual
update fails the same check, and end-to-end 2-token sequences on a tiny 32-token model.
"""

import pytest
import torch
from scipy.stats import chisquare

from eagle_trt.speculative import verify as verify_mod
from eagle_trt.speculative.sampling import SamplingParams, processed_probs
from eagle_trt.speculative.tree import tree_from_parents
from eagle_trt.speculative.verify import verify_sampling

END = -1


def chi2_pvalue(counts: dict, expected_probs: dict, n: int) -> float:
    """Chi-square p-value; cells with expected count < 5 are pooled into one."""
    obs, exp, pool_o, pool_e = [], [], 0.0, 0.0
    for key, p in expected_probs.items():
        e, o = p * n, counts.get(key, 0)
        if e < 5:
            pool_o, pool_e = pool_o + o, pool_e + e
        else:
            obs.append(o)
            exp.append(e)
    unexpected = sum(c for k, c in counts.items() if k not in expected_probs)
    pool_o += unexpected
    if pool_e > 0 or pool_o > 0:
        obs.append(pool_o)
        exp.append(max(pool_e, 1e-9))
    scale = sum(obs) / sum(exp)  # remove float rounding in the expected total
    return float(chisquare(obs, [e * scale for e in exp]).pvalue)


def _tree_and_probs(seed=0, vocab=16):
    g = torch.Generator().manual_seed(seed)
    #        0
    #     /  |  \
    #    1   2   3        children of root: tokens 3, 7, 1 (draft order)
    #   / \   \
    #  4   5   6
    tokens = torch.tensor([0, 3, 7, 1, 2, 3, 9])
    tree = tree_from_parents(tokens, torch.tensor([-1, 0, 0, 0, 1, 1, 2]))
    probs = torch.softmax(torch.randn(7, vocab, generator=g) * 1.5, dim=-1)
    return tree, probs


def _exact_two_tokens(tree, probs):
    kids = {int(tree.tokens[c]): c for c in range(1, 7) if int(tree.parents[c]) == 0}
    exact = {}
    for x in range(probs.shape[1]):
        px = float(probs[0, x])
        if x in kids:
            for y in range(probs.shape[1]):
                exact[(x, y)] = px * float(probs[kids[x], y])
        else:
            exact[(x, END)] = px
    return exact


def _draw_two_tokens(tree, probs, n, seed=1):
    g = torch.Generator().manual_seed(seed)
    counts = {}
    for _ in range(n):
        out = verify_sampling(tree, probs, g)
        seq = tree.tokens[out.path[1:]].tolist() + [out.bonus]
        key = (seq[0], seq[1] if len(seq) > 1 else END)
        counts[key] = counts.get(key, 0) + 1
    return counts


def test_tree_sampling_matches_target_exactly():
    tree, probs = _tree_and_probs()
    n = 20000
    assert chi2_pvalue(_draw_two_tokens(tree, probs, n), _exact_two_tokens(tree, probs), n) > 1e-3


def test_broken_residual_update_is_caught(monkeypatch):
    tree, probs = _tree_and_probs()
    monkeypatch.setattr(verify_mod, "remove_rejected", lambda p, token: p)  # forgets to remove q
    n = 20000
    assert chi2_pvalue(_draw_two_tokens(tree, probs, n), _exact_two_tokens(tree, probs), n) < 1e-6


def test_processed_probs_top_k_top_p():
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0, -1.0])
    p = processed_probs(logits, SamplingParams(temperature=1.0, top_k=3))
    assert (p[3:] == 0).all() and torch.isclose(p.sum(), torch.tensor(1.0))
    full = torch.softmax(logits, -1)
    p = processed_probs(logits, SamplingParams(temperature=1.0, top_p=0.8))
    # the top two hold 0.665+0.245 >= 0.8: exactly those two remain
    assert (p[2:] == 0).all() and torch.allclose(p[:2], full[:2] / full[:2].sum())


def test_typical_acceptance_is_labelled_lossy_and_accepts_confident_children():
    tree, probs = _tree_and_probs()
    probs = probs.clone()
    probs[0] = 0.0
    probs[0, 3] = 1.0  # the target is certain of the first child's token
    out = verify_sampling(tree, probs, torch.Generator().manual_seed(0), posterior_threshold=0.09)
    assert out.path.tolist()[:2] == [0, 1]


# ---- end to end: 2-token sequences from the runner on a 32-token model -----------------------------

@pytest.fixture(scope="module")
def small_vocab_runner(tmp_path_factory):
    from conftest import make_tiny_model, write_random_head

    from eagle_trt.models.draft_head import Eagle3DraftHead
    from eagle_trt.models.llama import LlamaTarget
    from eagle_trt.runtime.runner import Runner

    tmp = tmp_path_factory.mktemp("v32")
    model = make_tiny_model(tmp / "m", seed=3, init_std=0.25, vocab_size=32, with_tokenizer=False,
                            bos_token_id=0, eos_token_id=1, pad_token_id=2)
    head_dir = write_random_head(tmp / "d", seed=4, vocab=32, scale=0.3)
    target = LlamaTarget.load(model)
    return Runner(target, Eagle3DraftHead.load(head_dir, target), capacity=128)


def _exact_pairs(runner, prompt, params):
    t = runner.target
    cache = t.new_cache(64)
    logits, _ = t.forward(torch.tensor(prompt), torch.arange(len(prompt)), cache)
    p1 = processed_probs(logits[-1], params)
    exact = {}
    for x in range(p1.numel()):
        if p1[x] == 0:
            continue
        cache.length = 0
        seq = prompt + [x]
        lg, _ = t.forward(torch.tensor(seq), torch.arange(len(seq)), cache)
        p2 = processed_probs(lg[-1], params)
        for y in range(p2.numel()):
            if p2[y] > 0:
                exact[(x, y)] = float(p1[x] * p2[y])
    return exact


@pytest.mark.parametrize("tree_opts", [
    dict(tree="dynamic", beam_width=4, draft_length=3, total_tokens=10),
    dict(tree="static", static_tree=[[0], [1], [2], [0, 0], [0, 1], [1, 0]]),
    dict(tree="chain", draft_length=3),
], ids=["dynamic", "static", "chain"])
@pytest.mark.parametrize("sampling", [dict(temperature=1.0), dict(temperature=0.7, top_p=0.9, top_k=8)],
                         ids=["T1", "T0.7-p0.9-k8"])
def test_two_token_sequences_match_target(small_vocab_runner, tree_opts, sampling):
    from eagle_trt.config.decode import DecodeConfig

    prompt = [1, 2, 3, 4]
    params = SamplingParams(**sampling)
    exact = _exact_pairs(small_vocab_runner, prompt, params)
    # Force the first token through speculation too: the head drafts, the target verifies.
    n, counts = 1500, {}
    for seed in range(n):
        res = small_vocab_runner.generate(prompt, DecodeConfig(max_new_tokens=2, eos_token_ids=[], seed=seed,
                                                                **sampling, **tree_opts))
        key = tuple(res.token_ids)
        counts[key] = counts.get(key, 0) + 1
    assert chi2_pvalue(counts, exact, n) > 1e-3


def test_two_token_sequences_match_target_with_prompt_lookup(small_vocab_runner):
    """Copied tokens are point-mass proposals like the head's: sampling stays exact with them in the tree."""
    from eagle_trt.config.decode import DecodeConfig

    prompt = [5, 6, 7, 5, 6]  # the suffix [5, 6] occurred before: the lookup branch proposes [7, 5, 6]
    sampling = dict(temperature=1.0)
    exact = _exact_pairs(small_vocab_runner, prompt, SamplingParams(**sampling))
    n, counts, verified = 1500, {}, 0
    for seed in range(n):
        res = small_vocab_runner.generate(prompt, DecodeConfig(
            max_new_tokens=2, eos_token_ids=[], seed=seed, tree="dynamic", beam_width=2, draft_length=2,
            total_tokens=3, lookup_tokens=3, **sampling))
        key = tuple(res.token_ids)
        counts[key] = counts.get(key, 0) + 1
        verified += res.metrics.to_dict()["lookup_tokens_verified"]
    assert verified > 0
    assert chi2_pvalue(counts, exact, n) > 1e-3
