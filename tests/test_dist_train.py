"""Head training on torch.distributed (gloo, 2 ranks of 1 thread each): the same global batch gives one process's loss
curve and head, and a SIGTERM on one rank stops every rank with a checkpoint that a single process resumes
(`convert --nproc`'s own runs: tests/test_convert_nproc.py).

Tolerances: the loss curves of 1 and 2 ranks agree to 1e-4 relative per step and the heads to 1e-4 absolute (they
differ only in float summation order: the split batch is reweighted to the global token mean, see train_ddp.py);
greedy tau on the held-out prompts is equal.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from train_support import ENV, REPO, assert_loopback_only, finish, one_thread, wait_for, watch_listeners  # noqa: F401
from train_support import varied_chats as chats  # noqa: F401

from eagle_trt.convert.attach import attach_eagle3
from eagle_trt.convert.data import build_dataset
from eagle_trt.convert.distributed import World, rank_share, rank_span
from eagle_trt.convert.draft_vocab import d2t_from_vocab, load_d2t, ranking, select_draft_vocab
from eagle_trt.convert.load_target import load_target
from eagle_trt.convert.train import TrainConfig, build_feature_cache, read_checkpoint, samples_seen, train_head
from eagle_trt.convert.train_ddp import StepShare

WORKER = REPO / "tests" / "dist_train_worker.py"
STEPS = 40


@pytest.fixture(scope="module")
def cache(tiny_model_dir, chats, tmp_path_factory):
    _, tok, _ = load_target(tiny_model_dir)
    model, _, _ = load_target(tiny_model_dir)
    ds = build_dataset([chats], tok, seq_len=48, n_val=2, progress=False)
    return build_feature_cache(model, ds.sequences, [1, 3, 4], tmp_path_factory.mktemp("work") / "cache", key="k",
                               progress=False)


def fresh_model(tiny_model_dir, cache):
    """What tests/dist_train_worker.py trains."""
    model, _, _ = load_target(tiny_model_dir)
    model = attach_eagle3(model, 64)
    load_d2t(model, d2t_from_vocab(select_draft_vocab(ranking(cache.predicted_counts, cache.seen_counts), 64,
                                                      always=[257])))
    return model


def cfg(steps=STEPS):
    return TrainConfig(steps=steps, batch_size=4, lr=1e-3, checkpoint_every=100)


@pytest.fixture(scope="module")
def one_rank(tiny_model_dir, cache, tmp_path_factory):
    """The reference: one process, STEPS steps."""
    model = fresh_model(tiny_model_dir, cache)
    result = train_head(model, cache, cfg(), tmp_path_factory.mktemp("ref") / "c.safetensors", progress=False)
    return result.history, {k: v.detach().clone() for k, v in model.eagle_module.state_dict().items()}


# convert --nproc's own launcher in a process of its own, running its command as 2 ranks.
LAUNCHER = "import sys; from eagle_trt.convert.launch import run_ranks; sys.exit(run_ranks(2, sys.argv[1:]))"


def two_ranks(*args) -> subprocess.Popen:
    """tests/dist_train_worker.py ARGS as 2 ranks, started as `convert --nproc 2` starts its workers."""
    return subprocess.Popen([sys.executable, "-c", LAUNCHER, sys.executable, str(WORKER), *map(str, args)], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def read_head(path: Path) -> tuple[list[dict], dict[str, torch.Tensor]]:
    with safe_open(str(path), framework="pt") as f:
        return json.loads(f.metadata()["history"]), {k: f.get_tensor(k) for k in f.keys()}


def assert_same_run(history, head, ref_history, ref_head):
    assert [h["step"] for h in history] == [h["step"] for h in ref_history]
    for h, r in zip(history, ref_history):
        assert h["loss"] == pytest.approx(r["loss"], rel=1e-4), (h, r)
        assert h["acc"] == pytest.approx(r["acc"], abs=2e-3), (h, r)
    assert head.keys() == ref_head.keys()
    for k in head:
        torch.testing.assert_close(head[k], ref_head[k], rtol=0, atol=1e-4, msg=k)


# ---- the split --------------------------------------------------------------------------------------
def test_world_from_torchrun_env(monkeypatch):
    from eagle_trt.errors import InputError

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert World.from_env() == World() and not World().active
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    w = World.from_env()
    assert (w.rank, w.size, w.local_rank, w.active, w.is_main) == (3, 4, 1, True, False)
    assert w.device(torch.device("cpu")) == torch.device("cpu")
    monkeypatch.setenv("RANK", "4")
    with pytest.raises(InputError, match="RANK 4 does not fit WORLD_SIZE 4"):
        World.from_env()


def test_shares_and_spans():
    assert [rank_share([7, 3, 9, 1, 5], r, 2) for r in (0, 1)] == [[7, 9, 5], [3, 1]]
    assert rank_share([4], 1, 2) == []
    lengths = [10, 10, 10, 10, 10, 10, 60]  # 120 tokens: halves at 60
    assert [rank_span(lengths, r, 2) for r in (0, 1)] == [(0, 6), (6, 7)] and rank_span(lengths, 0, 1) == (0, 7)
    assert [rank_span([5] * 9, r, 3) for r in range(3)] == [(0, 3), (3, 6), (6, 9)]
    assert [rank_span([], r, 3) for r in range(3)] == [(0, 0)] * 3
    assert samples_seen(10, 4, 2) == 8 and samples_seen(10, 4, 3) == 10 and samples_seen(10, 4, 5) == 18


def _grads(model, cache, share: StepShare | None, idx):
    """The head's gradient of modelopt's loss on sequences idx (weighted as `share` says)."""
    model.zero_grad(set_to_none=True)
    model._cached_attn_blk_masks = {}
    b = cache.batch(idx)
    ctx = share.weighting(model) if share is not None else torch.enable_grad()
    with ctx:
        out = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], loss_mask=b["attention_mask"],
                    base_model_outputs={"aux_hidden_states": b["aux"], "base_model_hidden_states": b["hidden"]})
    out.loss.backward()
    return {n: p.grad.clone() for n, p in model.eagle_module.named_parameters() if p.grad is not None}


def test_weighted_shares_average_to_the_global_gradient(tiny_model_dir, cache):
    """What DDP computes (the mean of the ranks' gradients) equals one process's gradient on the whole batch, for
    ranks of unequal token counts; without the weights it does not (the mutation this test catches)."""
    model = fresh_model(tiny_model_dir, cache)
    from eagle_trt.convert.train import _offline_mode

    _offline_mode(model, cfg())
    model.train()
    batch = [0, 29, 1, 28, 15]  # the shortest and longest sequences: rank 0 gets 3, rank 1 gets 2
    assert cache.length(0) < cache.length(29)
    full = _grads(model, cache, None, batch)
    parts = [StepShare.of(batch, cache.length, World(r, 2), 3) for r in (0, 1)]
    mean = [_grads(model, cache, s, s.indices) for s in parts]
    plain = [_grads(model, cache, None, s.indices) for s in parts]
    worst = worst_plain = 0.0
    for k, g in full.items():
        scale = float(g.abs().max())
        worst = max(worst, float(((mean[0][k] + mean[1][k]) / 2 - g).abs().max()) / scale)
        worst_plain = max(worst_plain, float(((plain[0][k] + plain[1][k]) / 2 - g).abs().max()) / scale)
    assert worst < 1e-5, worst
    assert worst_plain > 1e-3, worst_plain
    empty = StepShare.of([3], cache.length, World(1, 2), 3)  # fewer sequences than ranks: a zero-weight stand-in
    assert empty.indices == [3] and empty.weight(0) == 0.0


# ---- 2 ranks against 1 -------------------------------------------------------------------------------
def test_two_ranks_give_one_ranks_curve_and_head(tiny_model_dir, cache, one_rank, tmp_path):
    """...and while they run, the launcher and both ranks listen on the loopback alone (the ranks meet through a
    file store; gloo listens on lo)."""
    out = tmp_path / "head.safetensors"
    proc = two_ranks(tiny_model_dir, cache.dir, "k", tmp_path / "c.safetensors", out, STEPS)
    seen = watch_listeners(proc)
    log, _ = finish(proc, 300)
    assert proc.returncode == 0, log[-3000:]
    assert_loopback_only(seen)
    assert_same_run(*read_head(out), *one_rank)
    _, meta = read_checkpoint(tmp_path / "c.safetensors")
    assert meta["step"] == STEPS and meta["extra"] == {"samples_seen": samples_seen(len(cache), 4, STEPS),
                                                       "world_size": 2}


def test_sigterm_on_one_rank_saves_and_one_rank_resumes(tiny_model_dir, cache, one_rank, tmp_path):
    """SIGTERM to rank 1 alone: both ranks stop after the same step, rank 0 saves; one process then resumes from that
    global step and ends where the uninterrupted run ends."""
    ckpt, out = tmp_path / "c.safetensors", tmp_path / "head.safetensors"
    proc = two_ranks(tiny_model_dir, cache.dir, "k", ckpt, out, STEPS, "--checkpoint-every", 2)
    wait_for(ckpt, proc)
    pids = dict(line.split() for line in Path(f"{out}.pids").read_text().splitlines())
    os.kill(int(pids["1"]), signal.SIGTERM)
    log, _ = finish(proc, 240)
    assert proc.returncode != 0 and not out.exists(), log[-3000:]  # interrupted: the worker wrote no final head
    for pid in pids.values():  # every rank has exited
        with pytest.raises(ProcessLookupError):
            os.kill(int(pid), 0)
    _, meta = read_checkpoint(ckpt)
    stopped = meta["step"]
    assert 2 <= stopped < STEPS and meta["extra"]["world_size"] == 2 and len(meta["history"]) == stopped
    # Rank 0 got no signal: it learnt of rank 1's, stopped after the same step and saved that step.
    said = [json.loads((tmp_path / f"head.safetensors.stopped-{r}").read_text()) for r in (0, 1)]
    assert said == [{"step": stopped, "exit_code": 143}] * 2, (said, stopped)
    assert sorted(p.name for p in tmp_path.iterdir()) == [  # no temp file
        "c.safetensors", "head.safetensors.pids", "head.safetensors.stopped-0", "head.safetensors.stopped-1"]

    model = fresh_model(tiny_model_dir, cache)
    result = train_head(model, cache, cfg(), ckpt, resume=True, progress=False)
    assert result.resumed_from == stopped and result.steps == STEPS
    head = {k: v.detach().clone() for k, v in model.eagle_module.state_dict().items()}
    assert_same_run(result.history, head, *one_rank)

