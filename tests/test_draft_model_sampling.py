"""Sampling with a draft model stays exactly the target's distribution (chi-square against the exact p).

At T > 0 a draft model's chain is drawn from its own q and verified by min(1, p/q) with residual max(0, p - q);
trees stay top-k picks verified as point masses; prompt-lookup copies grafted onto a drawn chain are point masses
beside q-drawn siblings. Pure-function draws on a hand-made 8-token problem (many draws, and mutations that must
fail), then 2-token sequences end to end on a 32-token target with a draft that agrees with it part of the time.
"""

import pytest
import torch

from eagle_trt.speculative import verify as verify_mod
from eagle_trt.speculative.sampling import SamplingParams
from eagle_trt.speculative.tree import tree_from_parents
from eagle_trt.speculative.verify import verify_sampling
from test_sampling import _exact_pairs, chi2_pvalue

V = 8


def _tables(seed=0):
    g = torch.Generator().manual_seed(seed)
    soft = lambda *s: torch.softmax(torch.randn(*s, generator=g) * 1.3, dim=-1)  # noqa: E731
    # Target p after the root and after each first token; the draft's q likewise, a different (related) model.
    p0, p1 = soft(V), soft(V, V)
    q0, q1 = torch.softmax(p0.log() + torch.randn(V, generator=g) * 0.7, -1), soft(V, V)
    q0[5] = 0.0  # the draft never proposes 5: the residual must still give it p0(5)
    q0 /= q0.sum()
    return p0, p1, q0, q1


def _draw(n: int, copied: int | None, seed=1):
    """n runs of: x1 ~ q0, x2 ~ q1[x1] (a drawn chain), plus a copied token under the root (point mass) unless it is
    x1 already; verification emits tokens, of which the first two are counted."""
    p0, p1, q0, q1 = _tables()
    g = torch.Generator().manual_seed(seed)
    counts = {}
    for _ in range(n):
        x1 = int(torch.multinomial(q0, 1, generator=g))
        x2 = int(torch.multinomial(q1[x1], 1, generator=g))
        tokens, parents, probs = [0, x1, x2], [-1, 0, 1], [p0, p1[x1], p0]  # node 2's row only draws a 3rd token
        proposals = {1: q0, 2: q1[x1]}
        if copied is not None and copied != x1:
            tokens.append(copied)
            parents.append(0)
            probs.append(p1[copied])
        tree = tree_from_parents(torch.tensor(tokens), torch.tensor(parents))
        out = verify_sampling(tree, torch.stack(probs), g, proposals=proposals)
        seq = tree.tokens[out.path[1:]].tolist() + [out.bonus]
        if len(seq) == 1:  # rejected at the root: the bonus is the first token, the second comes from p1
            seq.append(int(torch.multinomial(p1[seq[0]], 1, generator=g)))
        elif len(seq) == 2 and out.path.numel() == 2:
            pass  # x1 (or the copy) accepted, its bonus drawn from p1[x1]
        key = tuple(seq[:2])
        counts[key] = counts.get(key, 0) + 1
    exact = {(a, b): float(p0[a] * p1[a, b]) for a in range(V) for b in range(V)}
    return counts, exact


@pytest.mark.parametrize("copied", [None, 3], ids=["drawn-chain", "drawn-chain+copy"])
def test_drawn_chain_matches_target_exactly(copied):
    n = 30000
    counts, exact = _draw(n, copied)
    assert chi2_pvalue(counts, exact, n) > 1e-3


def test_point_mass_residual_for_a_drawn_token_is_caught(monkeypatch):
    # Treating a q-drawn token as a point mass on rejection (removing only x, not q) biases the output.
    monkeypatch.setattr(verify_mod, "residual", lambda p, q: verify_mod.remove_rejected(p, int(q.argmax())))
    n = 30000
    counts, exact = _draw(n, None)
    assert chi2_pvalue(counts, exact, n) < 1e-6


def test_drawn_tokens_are_accepted_more_often_than_point_masses():
    """Why the chain is drawn from q: min(1, p/q) accepts sum min(p, q) of the mass, a point mass E_q[p] (still exact:
    a point mass is exact for any token, however it was chosen, only accepted less often)."""
    p0, _, q0, _ = _tables()
    assert float(torch.minimum(p0, q0).sum()) > float((p0 * q0).sum()) + 0.05
    g = torch.Generator().manual_seed(2)
    hits = {True: 0, False: 0}
    for _ in range(4000):
        x = int(torch.multinomial(q0, 1, generator=g))
        tree = tree_from_parents(torch.tensor([0, x]), torch.tensor([-1, 0]))
        for drawn in hits:
            out = verify_sampling(tree, torch.stack([p0, p0]), g, proposals={1: q0} if drawn else None)
            hits[drawn] += out.path.numel() == 2
    assert hits[True] > hits[False] * 1.2


# ---- end to end: a 32-token target and a draft model that agrees with it part of the time -------------------

@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    from make_tiny_model import make_tiny_model
    from test_draft_model import model_runner, noisy_copy

    from eagle_trt.models.llama import LlamaTarget

    tmp = tmp_path_factory.mktemp("v32")
    model = make_tiny_model(tmp / "m", seed=3, init_std=0.25, vocab_size=32, with_tokenizer=False,
                            bos_token_id=0, eos_token_id=1, pad_token_id=2)
    return model_runner(LlamaTarget.load(model), noisy_copy(model, tmp / "d", 0.3), capacity=128)


@pytest.mark.parametrize("tree_opts", [
    dict(tree="chain", draft_length=3),
    dict(tree="dynamic", beam_width=4, draft_length=3, total_tokens=10),
    dict(tree="chain", draft_length=2, lookup_tokens=3),
], ids=["chain-drawn", "dynamic-topk", "chain-drawn+lookup"])
@pytest.mark.parametrize("sampling", [dict(temperature=1.0), dict(temperature=0.7, top_p=0.9, top_k=8)],
                         ids=["T1", "T0.7-p0.9-k8"])
def test_two_token_sequences_match_target(runner, tree_opts, sampling):
    from eagle_trt.config.decode import DecodeConfig

    prompt = [5, 6, 7, 5, 6]  # [5, 6] occurred before: with lookup on, the copy [7, 5, 6] is grafted too
    exact = _exact_pairs(runner, prompt, SamplingParams(**sampling))
    n, counts, accepted, rejected = 1500, {}, 0, 0
    for seed in range(n):
        res = runner.generate(prompt, DecodeConfig(max_new_tokens=2, eos_token_ids=[], seed=seed, fallback_after=0,
                                                    **sampling, **tree_opts))
        key = tuple(res.token_ids)
        counts[key] = counts.get(key, 0) + 1
        # The one verify step drafts one token; accepted, it is emitted and the bonus falls past max_new_tokens.
        accepted += sum(s.accepted for s in res.metrics.steps) + res.metrics.discarded_tokens
        rejected += res.metrics.rejections
    assert accepted > 100 and rejected > 100  # both branches of the acceptance test ran
    assert chi2_pvalue(counts, exact, n) > 1e-3
