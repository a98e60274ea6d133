"""Modified coin change in Z_n: write a ring offset as the fewest chosen strides (TopoOpt App. E.1)."""

from __future__ import annotations

from itertools import islice
from typing import Iterator, Sequence

import numpy as np

__all__ = ["coin_change_table", "coin_change", "coin_change_orders", "circulant_distances"]


def _check(coins: Sequence[int], modulus: int) -> np.ndarray:
    if modulus < 1:
        raise ValueError(f"modulus must be >= 1, got {modulus}")
    arr = np.unique(np.asarray(coins, dtype=np.int64) % modulus)
    arr = arr[arr != 0]
    if modulus > 1 and arr.size == 0:
        raise ValueError(f"need at least one non-zero coin mod {modulus}, got {list(coins)}")
    return arr


def coin_change_table(coins: Sequence[int], modulus: int) -> tuple[np.ndarray, np.ndarray]:
    """Fewest coins for every residue of Z_n, by breadth-first search from 0.

    Parameters
    ----------
    coins : sequence of int
        Ring strides; each may be used any number of times (non-negative combinations).
    modulus : int
        n, the size of the group the strides act on.

    Returns
    -------
    count : ndarray of int64, shape (n,)
        ``count[r]`` = fewest coins summing to ``r`` mod n (``-1`` if unreachable).
    last : ndarray of int64, shape (n,)
        A coin of one minimal decomposition of ``r`` (``0`` for ``r = 0`` or unreachable).

    Notes
    -----
    The Cayley digraph of Z_n with generators ``coins`` is exactly the AllReduce
    sub-topology of one group (a directed ring per stride), so ``count`` is its hop
    distance from any member and ``max(count)`` its diameter. Each BFS level is one
    vectorized step over the frontier.

    Examples
    --------
    >>> count, _ = coin_change_table([1, 5], 12)
    >>> int(count[10]), int(count[11])
    (2, 3)
    """
    arr = _check(coins, modulus)
    count = np.full(modulus, -1, dtype=np.int64)
    last = np.zeros(modulus, dtype=np.int64)
    count[0] = 0
    frontier = np.zeros(1, dtype=np.int64)
    level = 0
    while frontier.size:
        level += 1
        nxt = (frontier[:, None] + arr[None, :]) % modulus
        coin = np.broadcast_to(arr[None, :], nxt.shape)
        nxt, coin = nxt.ravel(), coin.ravel()
        fresh = count[nxt] < 0
        nxt, coin = nxt[fresh], coin[fresh]
        nxt, first = np.unique(nxt, return_index=True)  # smallest coin wins a tie
        count[nxt] = level
        last[nxt] = coin[first]
        frontier = nxt
    return count, last


def circulant_distances(strides: Sequence[int], modulus: int) -> np.ndarray:
    """Hop distance from member 0 to every member over the rings ``strides`` (= coin counts)."""
    return coin_change_table(strides, modulus)[0]


def coin_change(offset: int, coins: Sequence[int], modulus: int,
                table: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[int, ...]:
    """A minimal multiset of coins summing to ``offset`` mod n, largest coin first.

    Parameters
    ----------
    offset : int
        The ring offset to cover (taken mod n).
    coins, modulus : see :func:`coin_change_table`.
    table : optional
        A precomputed :func:`coin_change_table` for the same coins and modulus.

    Returns
    -------
    tuple of int
        Empty for offset 0.

    Raises
    ------
    ValueError
        If the offset is not reachable (the coins share a factor with n).

    Examples
    --------
    >>> coin_change(11, [1, 5], 12)
    (5, 5, 1)
    """
    count, last = table if table is not None else coin_change_table(coins, modulus)
    r = int(offset) % modulus
    if count[r] < 0:
        raise ValueError(f"offset {offset} is not a sum of coins {list(coins)} mod {modulus}")
    out = []
    while r:
        c = int(last[r])
        out.append(c)
        r = (r - c) % modulus
    return tuple(sorted(out, reverse=True))


def _multiset_permutations(items: Sequence[int]) -> Iterator[tuple[int, ...]]:
    """The distinct orders of ``items`` in ascending lexicographic order.

    Narayana Pandita's next-permutation step, which skips repeated orders of equal
    items; the same sequence as sympy's ``multiset_permutations`` (without importing
    sympy).
    """
    a = sorted(int(c) for c in items)
    while True:
        yield tuple(a)
        i = len(a) - 2
        while i >= 0 and a[i] >= a[i + 1]:
            i -= 1
        if i < 0:
            return
        j = len(a) - 1
        while a[j] <= a[i]:
            j -= 1
        a[i], a[j] = a[j], a[i]
        a[i + 1:] = a[:i:-1]


def coin_change_orders(coins_used: Sequence[int], limit: int) -> list[tuple[int, ...]]:
    """Up to ``limit`` distinct orders of a coin multiset (largest-first order first).

    Every order of a *minimal* decomposition is a simple path: were a contiguous run of
    coins to sum to 0 mod n it could be dropped, contradicting minimality. So distinct
    orders are distinct shortest paths, over which AllReduce bytes can be spread.
    """
    first = tuple(sorted(coins_used, reverse=True))
    out = [first]
    if limit <= 1 or len(set(first)) <= 1:
        return out
    for order in islice(_multiset_permutations(first), 2 * limit):
        if order != first:
            out.append(order)
            if len(out) >= limit:
                break
    return out
