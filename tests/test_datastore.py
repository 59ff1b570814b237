"""The lookup datastore: its n-gram index, the file the head carries, build and runtime plumbing, losslessness."""

import json

import pytest
import torch

from eagle_trt.engine.datastore_file import DATASTORE_NAME, check_datastore, read_datastore, write_datastore
from eagle_trt.errors import CheckpointError
from eagle_trt.models.draft_head import Eagle3DraftHead
from eagle_trt.models.llama import LlamaTarget
from eagle_trt.config.decode import DecodeConfig
from eagle_trt.runtime.runner import Runner
from eagle_trt.speculative.datastore import Datastore
from eagle_trt.timing import TickClock
from lossless_support import assert_lossless


def store_of(docs, **kw):
    flat = []
    for d in docs:
        flat += d + [-1]
    return Datastore(torch.tensor(flat[:-1]), **kw)


def test_most_frequent_continuation_first_and_distinct_first_tokens():
    store = store_of([[1, 2, 3, 4], [1, 2, 3, 5, 6], [9, 2, 3, 5, 7], [2, 3, 5, 6]], ngrams=(2,))
    # (2, 3) is followed by 5 three times, by 4 once; after 5, 6 twice and 7 once.
    assert store.proposals([0, 2, 3], max_tokens=3, branches=1) == [[5, 6]]
    assert store.proposals([0, 2, 3], max_tokens=3, branches=3) == [[5, 6], [4]]
    assert store.proposals([0, 2, 3], max_tokens=1, branches=2) == [[5], [4]]
    assert store.proposals([0, 2, 3], max_tokens=0, branches=2) == []
    assert store.proposals([0, 8, 8], max_tokens=3, branches=2) == []  # never seen
    assert store.proposals([3], max_tokens=3, branches=2) == []  # shorter than every indexed n-gram


def test_longest_indexed_suffix_wins_and_separators_are_never_crossed():
    store = store_of([[7, 1, 2, 50, 51], [1, 2, 60], [8, 1, 2, 60]], ngrams=(3, 2))
    assert store.proposals([7, 1, 2], 4, 1) == [[50, 51]]  # the 3-gram (7, 1, 2) occurred once
    assert store.proposals([5, 1, 2], 4, 1) == [[60]]  # only (1, 2): 60 twice; the copy stops at the doc end
    # n-grams that straddle a separator are not indexed: (51, 1) spans two documents.
    assert store.proposals([51, 1], 4, 1) == []


def test_only_the_latest_hits_are_counted():
    docs = [[1, 2, 3]] * 5 + [[1, 2, 4]] * 2
    assert store_of(docs, ngrams=(2,)).proposals([1, 2], 1, 1) == [[3]]
    assert store_of(docs, ngrams=(2,), max_hits=2).proposals([1, 2], 1, 1) == [[4]]  # the last two docs
    assert len(store_of(docs)) == 21
    with pytest.raises(ValueError):
        Datastore(torch.tensor([1, 2]), ngrams=())


def test_file_round_trip_and_bad_files(tmp_path):
    path = tmp_path / DATASTORE_NAME
    assert write_datastore(path, [[1, 2, 3], [], [4, 5]]) == 5
    assert check_datastore(path, vocab_size=10).tolist() == [1, 2, 3, -1, 4, 5]
    assert read_datastore(path, vocab_size=10).proposals([1, 2], 2, 1) == [[3]]
    with pytest.raises(CheckpointError, match="outside"):
        check_datastore(path, vocab_size=5)  # token 5 does not exist in a 5-token vocabulary
    from safetensors.torch import save_file

    save_file({"tokens": torch.zeros(3)}, str(path))
    with pytest.raises(CheckpointError, match="integer tensor 'tokens'"):
        check_datastore(path, vocab_size=10)
    path.write_bytes(b"not safetensors")
    with pytest.raises(CheckpointError, match="not a readable safetensors"):
        check_datastore(path, vocab_size=10)


@pytest.fixture(scope="module")
def runner(tiny_model_dir, tiny_head_dir):
    target = LlamaTarget.load(tiny_model_dir)
    return Runner(target, Eagle3DraftHead.load(tiny_head_dir, target), capacity=512, clock=TickClock())


@pytest.mark.parametrize("tree", [dict(tree="dynamic", beam_width=2, draft_length=2, total_tokens=3),
                                  dict(tree="chain", draft_length=2)], ids=["dynamic", "chain"])
def test_greedy_with_a_datastore_equals_ar_and_uses_it(runner, tree):
    prompt, other = [100, 20, 30, 40], [3, 1, 4, 1, 5]
    ar = runner.generate(prompt, DecodeConfig(max_new_tokens=40, mode="ar", eos_token_ids=[])).token_ids
    # A datastore that saw this continuation once (and an unrelated text): its copies should be accepted.
    runner.datastore = store_of([other + [7, 7, 7], prompt + ar])
    try:
        opts = dict(max_new_tokens=40, eos_token_ids=[], lookup_tokens=6, lookup_branches=1, **tree)
        with_store = runner.generate(prompt, DecodeConfig(datastore_branches=1, **opts))
        context_only = runner.generate(prompt, DecodeConfig(datastore_branches=0, **opts))
    finally:
        runner.datastore = None
    assert_lossless(runner, prompt, with_store.token_ids, ar)
    assert_lossless(runner, prompt, context_only.token_ids, ar)
    assert (with_store.metrics.to_dict()["lookup_tokens_accepted"]
            > context_only.metrics.to_dict()["lookup_tokens_accepted"])
    assert with_store.metrics.acceptance_length > context_only.metrics.acceptance_length
    m = with_store.metrics.to_dict()
    assert 0 < m["datastore_tokens_accepted"] <= m["lookup_tokens_accepted"]
    assert 0 < m["datastore_tokens_verified"] <= m["lookup_tokens_verified"]
    assert context_only.metrics.to_dict()["datastore_tokens_verified"] == 0


def test_datastore_branches_reserve_cache_room():
    assert (DecodeConfig(lookup_tokens=8, lookup_branches=2, datastore_branches=1).tree_capacity()
            == DecodeConfig(lookup_tokens=8, lookup_branches=2, datastore_branches=0).tree_capacity() + 8)


def test_build_ships_the_heads_datastore_and_the_session_loads_it(tiny_checkpoint, tmp_path):
    import shutil

    from conftest import build_tiny_engine

    from eagle_trt.runtime.session import Session

    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint, ckpt)
    write_datastore(ckpt / "draft" / DATASTORE_NAME, [[1, 2, 3, 4], [2, 3, 9]])
    engine = build_tiny_engine(ckpt, tmp_path)
    manifest = json.loads((engine / "manifest.json").read_text())
    assert f"draft/{DATASTORE_NAME}" in manifest["files"]
    session = Session.open(engine, clock=TickClock())
    assert session.runner.datastore is not None and len(session.runner.datastore) == 7
    assert session.decode_config().datastore_branches == 1  # the config default
    # A datastore for another vocabulary is refused at build time, naming the file.
    from eagle_trt.config.schema import EagleConfig
    from eagle_trt.engine.checkpoint import inspect_checkpoint

    write_datastore(ckpt / "draft" / DATASTORE_NAME, [[10**6]])
    with pytest.raises(CheckpointError, match=DATASTORE_NAME):
        inspect_checkpoint(EagleConfig(checkpoint_dir=str(ckpt), max_input_len=64, max_output_len=128), ckpt)


def test_an_engine_stores_the_index_and_opening_it_sorts_nothing(tmp_path, monkeypatch):
    from eagle_trt.engine.datastore_file import read_datastore, write_datastore, write_indexed
    from eagle_trt.speculative.datastore import Datastore

    g = torch.Generator().manual_seed(3)
    docs = [torch.randint(0, 50, (400,), generator=g).tolist() for _ in range(5)]
    write_datastore(tmp_path / "plain.safetensors", docs)
    write_indexed(tmp_path / "plain.safetensors", tmp_path / "engine.safetensors", 50)
    built = read_datastore(tmp_path / "plain.safetensors", 50)
    direct = Datastore(torch.tensor(sum(([-1] + d for d in docs), [])[1:]))

    def no_sort(*a, **k):
        raise AssertionError("the stored index was sorted again")

    monkeypatch.setattr(torch, "argsort", no_sort)
    stored = read_datastore(tmp_path / "engine.safetensors", 50)
    assert set(stored.index_tensors()) == set(built.index_tensors())
    assert all(torch.equal(stored.index_tensors()[k], v) for k, v in built.index_tensors().items())
    for tail in ([1, 2, 3, 4], docs[2][100:104], docs[4][7:11], [49, 48]):
        assert stored.proposals(tail, 6, 3) == built.proposals(tail, 6, 3) == direct.proposals(tail, 6, 3)
