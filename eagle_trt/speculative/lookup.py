"""Prompt-lookup branches: draft tokens copied from the context, grafted onto the EAGLE tree.

Code and extraction answers repeat what they have already seen (identifiers, argument lists, quoted
text). When the last few committed tokens occurred earlier in the prompt or the output, the tokens that
followed them then are a cheap guess for what follows now. `NgramIndex` finds that guess in O(1) per
step; `graft` adds it to the draft tree as one more root-to-leaf path, sharing any prefix the tree
already has, so the target checks both in the same forward pass.

Lossless either way: verification only ever keeps tokens the target itself would emit (greedy), and the
sampling rule treats every draft token as a point-mass proposal (speculative/verify.py), which a copied
token is too. A bad guess costs only the extra rows in the verify pass.

    >>> index = NgramIndex(max_ngram=2)
    >>> index.extend([5, 6, 7, 8, 5, 6])
    >>> index.proposals(3, branches=2)
    [[7, 8, 5]]
    >>> graft([5, 7, 9], [-1, 0, 0], [7, 8])
    ([5, 7, 9, 8], [-1, 0, 0, 1], 1)
"""

from __future__ import annotations


class NgramIndex:
    """The token history with, for every n-gram (n <= max_ngram), every place it ended before the end.

    The n-grams ending at the newest token are registered only when the next token arrives, so a lookup of
    the current suffix always finds an earlier occurrence, never itself."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram; got {min_ngram}, {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.tokens: list[int] = []
        self._ends: dict[tuple[int, ...], list[int]] = {}  # n-gram -> where it ended, oldest first

    def extend(self, tokens: list[int]) -> None:
        for tok in tokens:
            end = len(self.tokens) - 1  # the previous newest token: its n-grams become searchable now
            for n in range(1, min(self.max_ngram, end + 1) + 1):
                self._ends.setdefault(tuple(self.tokens[end - n + 1: end + 1]), []).append(end)
            self.tokens.append(int(tok))

    def proposals(self, max_tokens: int, branches: int) -> list[list[int]]:
        """Up to `branches` distinct continuations: the longest matching suffix first, its latest earlier
        occurrence first, then older ones, then shorter suffixes."""
        tail = self.tokens[-self.max_ngram:]
        size = len(tail)
        out: list[list[int]] = []
        if max_tokens <= 0 or branches <= 0:
            return out
        for n in range(min(self.max_ngram, size), self.min_ngram - 1, -1):
            for end in reversed(self._ends.get(tuple(tail[size - n:]), ())):
                chain = self.tokens[end + 1: end + 1 + max_tokens]
                if chain and chain not in out:
                    out.append(chain)
                    if len(out) == branches:
                        return out
        return out


def copied_chains(index: NgramIndex, datastore, tokens: int, branches: int,
                  datastore_branches: int) -> tuple[list[list[int]], list[list[int]]]:
    """The copies one verify step grafts: up to `branches` continuations from the context (`index`), then up
    to `datastore_branches` more from `datastore` (a `Datastore` or None) that differ from those."""
    chains = index.proposals(tokens, branches)
    if datastore is None or datastore_branches <= 0 or tokens <= 0:
        return chains, []
    extra = datastore.proposals(index.tokens[-max(datastore.ngrams):], tokens, datastore_branches + len(chains))
    return chains, [c for c in extra if c not in chains][:datastore_branches]


def copy_budget(max_verify_rows: int, tree_rows: int) -> int | None:
    """Rows the copies may add under a cap of `max_verify_rows` verify rows when the head's tree takes `tree_rows`
    (root included): what `within_rows` is given, by the runtime and by `tune` alike. None = no cap (0)."""
    return max(max_verify_rows - tree_rows, 0) if max_verify_rows > 0 else None


def within_rows(chains: list[list[int]], more: list[list[int]], budget: int | None
                ) -> tuple[list[list[int]], list[list[int]]]:
    """The copies cut so that together they add at most `budget` nodes (their distinct prefixes, `trie_size`):
    in priority order (`chains`, then `more`), each keeps its longest prefix that still fits. None = no cut.

    Why: a verify forward's cost is not smooth in its rows. The bf16 projections run in chunks of
    `INVARIANT_ROWS` (models/gemm.py), so one row past a chunk boundary pays another pass over every weight.
    The cut ignores rows a copy shares with the head's tree (a copy adds at most what is counted here), so
    `tune` replays it exactly without the head's tree."""
    if budget is None:
        return chains, more
    seen: set[tuple[int, ...]] = set()
    kept: list[list[list[int]]] = [[], []]
    for side, group in enumerate((chains, more)):
        for chain in group:
            n = 0
            while n < len(chain) and (tuple(chain[:n + 1]) in seen or len(seen) < budget):
                seen.add(tuple(chain[:n + 1]))
                n += 1
            if n:
                kept[side].append(chain[:n])
    return kept[0], kept[1]


def trie_size(chains: list[list[int]]) -> int:
    """Nodes the chains add below an empty root: their distinct prefixes."""
    return len({tuple(c[:i]) for c in chains for i in range(1, len(c) + 1)})


def matched(chain: list[int], continuation: list[int]) -> int:
    """How many leading tokens of `chain` equal the continuation's (what greedy verification accepts)."""
    n = 0
    for a, b in zip(chain, continuation):
        if a != b:
            break
        n += 1
    return n


def shared_prefix(tokens: list[int], parents: list[int], chain: list[int]) -> int:
    """How many leading tokens of `chain` are already a path below the root of the tree (tokens/parents, root
    first): the tokens `graft` would add no node for.

    >>> shared_prefix([5, 7, 9, 8], [-1, 0, 0, 1], [7, 8, 1])
    2
    """
    node, n = 0, 0
    for tok in chain:
        nxt = next((i for i in range(1, len(parents)) if parents[i] == node and tokens[i] == tok), None)
        if nxt is None:
            break
        node, n = nxt, n + 1
    return n


def graft(tokens: list[int], parents: list[int], chain: list[int]) -> tuple[list[int], list[int], int]:
    """Add `chain` as a path below the root (node 0) of a tree given by tokens/parents (root first, every
    parent before its children). Where the tree already has the chain's next token as a child, the path
    follows it; the rest of the chain becomes new nodes appended at the end (children stay distinct).

    Returns (tokens, parents, number of nodes added)."""
    tokens, parents = list(tokens), list(parents)
    children: dict[int, dict[int, int]] = {}
    for i in range(1, len(parents)):
        children.setdefault(parents[i], {}).setdefault(tokens[i], i)
    node, added = 0, 0
    for tok in chain:
        nxt = children.get(node, {}).get(tok)
        if nxt is None:
            nxt = len(tokens)
            tokens.append(int(tok))
            parents.append(node)
            children.setdefault(node, {})[tok] = nxt
            added += 1
        node = nxt
    return tokens, parents, added
