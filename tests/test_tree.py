"""Tree construction on hand-drawn trees, with the expected masks, positions and retrieve indices written out."""

import pytest
import torch

from eagle_trt.speculative.tree import (
    DEFAULT_STATIC_TREE, chain_choices, select_top_nodes, static_layout, tree_from_parents, trim_choices,
)

T, F = True, False


def test_three_node_fork():
    #   0
    #  / \
    # 1   2
    t = tree_from_parents(torch.tensor([10, 11, 12]), torch.tensor([-1, 0, 0]))
    assert t.mask.tolist() == [[T, F, F], [T, T, F], [T, F, T]]
    assert t.depths.tolist() == [0, 1, 1]
    assert t.positions(5).tolist() == [5, 6, 6]
    assert t.retrieve.tolist() == [[0, 1], [0, 2]]
    assert t.size == 2 and t.depth == 1


def test_seven_node_tree():
    #        0
    #      /   \
    #     1     2
    #    / \     \
    #   3   4     5
    #   |
    #   6
    t = tree_from_parents(torch.arange(7), torch.tensor([-1, 0, 0, 1, 1, 2, 3]))
    assert t.mask.int().tolist() == [
        [1, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0],
        [1, 0, 1, 0, 0, 0, 0],
        [1, 1, 0, 1, 0, 0, 0],
        [1, 1, 0, 0, 1, 0, 0],
        [1, 0, 1, 0, 0, 1, 0],
        [1, 1, 0, 1, 0, 0, 1],
    ]
    assert t.positions(10).tolist() == [10, 11, 11, 12, 12, 12, 13]
    assert t.retrieve.tolist() == [[0, 1, 4, -1], [0, 2, 5, -1], [0, 1, 3, 6]]


def test_chain_of_four():
    t = tree_from_parents(torch.tensor([1, 2, 3, 4]), torch.tensor([-1, 0, 1, 2]))
    assert t.mask.int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    assert t.retrieve.tolist() == [[0, 1, 2, 3]]


def test_root_only_tree():
    t = tree_from_parents(torch.tensor([9]), torch.tensor([-1]))
    assert t.retrieve.tolist() == [[0]] and t.size == 0


def test_parents_must_precede_children():
    with pytest.raises(ValueError, match="parent before its child"):
        tree_from_parents(torch.arange(3), torch.tensor([-1, 2, 0]))


def test_static_layout_orders_breadth_first():
    lay = static_layout([[1], [0, 0], [0], [0, 1], [1, 0]])
    # sorted: [0], [1], [0,0], [0,1], [1,0]
    assert lay.parents.tolist() == [-1, 0, 0, 1, 1, 2]
    assert lay.ranks.tolist() == [0, 0, 1, 0, 1, 0]
    assert lay.depths.tolist() == [0, 1, 1, 2, 2, 2]


def test_static_layout_rejects_orphans_and_negative_ranks():
    with pytest.raises(ValueError, match=r"has no parent \[0\]"):
        static_layout([[0, 1]])
    with pytest.raises(ValueError, match="ranks >= 0"):
        static_layout([[-1]])


def test_chain_and_trim():
    assert chain_choices(3) == [[0], [0, 0], [0, 0, 0]]
    trimmed = trim_choices(DEFAULT_STATIC_TREE, max_depth=2, max_nodes=6)
    assert trimmed == [[0], [1], [2], [3], [0, 0], [0, 1]]
    static_layout(trimmed)  # still ancestor-closed


def test_select_top_nodes_keeps_best_and_is_ancestor_closed():
    # candidates in creation order: depth-1 a(0) b(1); depth-2 children of a: c(2) d(3); of b: e(4)
    scores = torch.tensor([-0.1, -1.0, -0.3, -2.0, -1.2])
    parents = torch.tensor([-1, -1, 0, 0, 1])
    depths = torch.tensor([1, 1, 2, 2, 2])
    kept, tree_par = select_top_nodes(scores, parents, depths, total_tokens=3)
    assert kept.tolist() == [0, 1, 2]  # a, b, c (c beats b's child e and a's child d)
    assert tree_par.tolist() == [0, 0, 1]  # a, b under the root; c under a (tree node 1)


def test_select_top_nodes_tie_goes_to_parent():
    # child with log-prob 0 has the same score as its parent; with one slot the parent must win
    kept, tree_par = select_top_nodes(torch.tensor([-0.5, -0.5]), torch.tensor([-1, 0]), torch.tensor([1, 2]), 1)
    assert kept.tolist() == [0] and tree_par.tolist() == [0]


def test_select_top_nodes_min_score_prunes():
    kept, _ = select_top_nodes(torch.tensor([-0.1, -3.0, -0.2]), torch.tensor([-1, -1, 0]),
                               torch.tensor([1, 1, 2]), total_tokens=3, min_score=-1.0)
    assert kept.tolist() == [0, 2]
