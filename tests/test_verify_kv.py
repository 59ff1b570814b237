"""Greedy verification and KV-cache compaction on hand-made inputs."""

import torch

from eagle_trt.models.kv_cache import FP8, KVCache
from eagle_trt.speculative.tree import tree_from_parents
from eagle_trt.speculative.verify import verify_greedy


def _seven():
    #        0(t=50)
    #      /        \
    #   1(t=60)    2(t=61)
    #   /   \          \
    # 3(70) 4(71)     5(72)
    #   |
    # 6(80)
    return tree_from_parents(torch.tensor([50, 60, 61, 70, 71, 72, 80]), torch.tensor([-1, 0, 0, 1, 1, 2, 3]))


def test_accepts_longest_matching_path_and_bonus():
    t = _seven()
    # target argmax after each node: after root 60, after node1 70, after node3 80, after node6 99
    nxt = torch.tensor([60, 70, 0, 80, 0, 0, 99])
    path, bonus = verify_greedy(t, nxt)
    assert path.tolist() == [0, 1, 3, 6] and bonus == 99


def test_rejects_everything():
    t = _seven()
    path, bonus = verify_greedy(t, torch.tensor([42, 0, 0, 0, 0, 0, 0]))
    assert path.tolist() == [0] and bonus == 42


def test_second_branch():
    t = _seven()
    path, bonus = verify_greedy(t, torch.tensor([61, 0, 72, 0, 0, 5, 0]))
    assert path.tolist() == [0, 2, 5] and bonus == 5


def test_partial_path():
    t = _seven()
    path, bonus = verify_greedy(t, torch.tensor([60, 71, 0, 0, 7, 0, 0]))
    assert path.tolist() == [0, 1, 4] and bonus == 7


def test_compact_moves_accepted_slots_to_the_front():
    c = KVCache(num_layers=2, num_kv_heads=1, head_dim=2, capacity=16, dtype=torch.float32,
                compute_dtype=torch.float32)
    start = 3
    slots = torch.arange(16, dtype=torch.float32)
    c.k[:] = slots[None, None, :, None]
    c.v[:] = -slots[None, None, :, None]
    c.compact(start, torch.tensor([0, 2, 5, 6]))
    assert c.k[1, 0, :7, 0].tolist() == [0, 1, 2, 3, 5, 8, 9]
    assert c.v[0, 0, :7, 0].tolist() == [0, -1, -2, -3, -5, -8, -9]


def test_fp8_cache_round_trip_error_is_bounded():
    torch.manual_seed(0)
    c = KVCache(1, 2, 8, 32, FP8, torch.float32, k_scales=torch.tensor([0.05]), v_scales=torch.tensor([0.02]))
    k, v = torch.randn(2, 5, 8) * 3, torch.randn(2, 5, 8)
    c.write(0, 0, k, v)
    kr, vr = c.read(0, 5)
    # e4m3 keeps 3 mantissa bits: relative error <= 2^-4 away from the subnormal range
    assert ((kr - k).abs() <= k.abs() / 16 + 0.05 * 2**-9).all()
    assert ((vr - v).abs() <= v.abs() / 16 + 0.02 * 2**-9).all()
    assert c.nbytes == 2 * 2 * 32 * 8  # one byte per element
