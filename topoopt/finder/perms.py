"""TotientPerms and SelectPermutations: regular ring strides for an AllReduce group (TopoOpt §4.3)."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment

from topoopt.routing.coin_change import circulant_distances

__all__ = ["totient_perms", "PermutationSelection", "select_permutations", "ring_order",
           "geometric_targets"]


def totient_perms(n: int, primes_only: bool = False) -> tuple[int, ...]:
    """Strides ``p < n`` with ``gcd(p, n) = 1``: each gives the ring ``i -> (i + p) mod n``.

    Parameters
    ----------
    n : int
        Group size, at least 2.
    primes_only : bool
        Keep only 1 and the primes among them: O(n / ln n) candidates for large groups
        (Prime Number Theorem). 1 is kept because the neighbour ring is always valid.

    Returns
    -------
    tuple of int
        Ascending. ``len(totient_perms(n)) == sympy.totient(n)``.

    Notes
    -----
    ``p`` generates Z_n exactly when ``gcd(p, n) = 1``, so the ring visits every member
    once: a Hamiltonian cycle, a valid ring-AllReduce order (TopoOpt §4.3, App. E.1).

    Examples
    --------
    >>> totient_perms(12)
    (1, 5, 7, 11)
    >>> totient_perms(12, primes_only=True)
    (1, 5, 7, 11)
    >>> totient_perms(30, primes_only=True)
    (1, 7, 11, 13, 17, 19, 23, 29)
    """
    if int(n) != n or n < 2:
        raise ValueError(f"a ring needs a group of at least 2 members, got n={n}")
    n = int(n)
    if primes_only:
        primes = _primes_below(n)
        cands = np.r_[np.int64(1), primes[n % primes != 0]]
    else:
        cands = np.arange(1, n, dtype=np.int64)
        cands = cands[np.gcd(cands, n) == 1]
    return tuple(int(p) for p in cands)


def _primes_below(n: int) -> np.ndarray:
    """The primes ``p < n``, ascending (sieve of Eratosthenes)."""
    sieve = np.ones(max(n, 2), dtype=bool)
    sieve[:2] = False
    for p in range(2, math.isqrt(n) + 1):
        if sieve[p]:
            sieve[p * p::p] = False
    return np.flatnonzero(sieve[:n]).astype(np.int64)


def ring_order(members: tuple[int, ...], stride: int) -> tuple[int, ...]:
    """The ring of ``stride`` over ``members`` (group index space): ``m[0], m[p], m[2p], ...``."""
    g = len(members)
    return tuple(members[(i * stride) % g] for i in range(g))


def geometric_targets(m: int, c_max: float, c_min: float = 1.0) -> np.ndarray:
    """``c_min * r**i`` for ``i < m`` with ``r = (c_max / c_min) ** (1 / m)``."""
    r = (c_max / c_min) ** (1.0 / m)
    return c_min * r ** np.arange(m)


@dataclass(frozen=True)
class PermutationSelection:
    """Strides chosen for one group and the distances they give (its circulant digraph).

    Attributes
    ----------
    group_size : int
    strides : tuple of int
        One per ring (repeated when the group has more degree than distinct strides).
    diameter : int
        Largest hop count between two members over these rings alone.
    mean_distance : float
        Average hop count over ordered member pairs.
    target : tuple of float
        The geometric sequence the strides were fitted to (empty when all were taken).
    l1 : float
        L1 distance between the strides and the target (signed targets counted mod n).
    """

    group_size: int
    strides: tuple[int, ...]
    diameter: int
    mean_distance: float
    target: tuple[float, ...] = ()
    l1: float = 0.0


def _evaluate(g: int, strides) -> tuple[int, float]:
    dist = circulant_distances(strides, g)
    return int(dist.max()), float(dist[1:].mean()) if g > 1 else 0.0


def _refine(n: int, strides: tuple[int, ...], cands: np.ndarray, key: tuple,
            max_evals: int, seed: int) -> tuple[tuple[int, ...], tuple]:
    """First-improvement local search: swap one stride for another candidate."""
    rng = np.random.default_rng(seed)
    cur, evals, improved = list(strides), 0, True
    while improved and evals < max_evals:
        improved = False
        pool = cands if cands.size <= 48 else rng.choice(cands, 48, replace=False)
        for i in range(len(cur)):
            for c in pool:
                if int(c) in cur or evals >= max_evals:
                    continue
                trial = sorted(cur[:i] + [int(c)] + cur[i + 1:])
                evals += 1
                k = _evaluate(n, trial)
                if k < key:
                    cur, key, improved = trial, k, True
                    break
    return tuple(cur), key


def select_permutations(n: int, m: int, candidates: tuple[int, ...] | None = None, *,
                        primes_only: bool = False, variants: int = 16, refine: int = 300,
                        seed: int = 0) -> PermutationSelection:
    """Choose ``m`` ring strides close in L1 to a geometric sequence (Algorithm 3).

    Parameters
    ----------
    n : int
        Group size.
    m : int
        d_k, rings to choose (at least 1).
    candidates : tuple of int, optional
        Strides to choose from; default :func:`totient_perms` ``(n, primes_only)``.
    primes_only : bool
        Passed to :func:`totient_perms` when ``candidates`` is not given.
    variants : int
        Geometric targets tried: ``c_max`` log-spaced in ``[n ** 0.5, n]`` (Chord's
        base-``n ** (1/m)`` digits are ``c_max = n``), each also with every other target
        mirrored to ``n - t`` (a ring running backwards).
    refine : int
        Beyond the paper: at most this many single-stride swaps are tried after the
        fit, each kept when it lowers the measured ``(diameter, mean distance)``
        (0 = the L1 fit only). ``target`` and ``l1`` still describe the fit.
    seed : int
        Seeds the candidate sample of the swap search for groups above 48 strides.

    Returns
    -------
    PermutationSelection

    Notes
    -----
    For one target ``t``, the L1-closest set of distinct strides is a rectangular
    assignment problem (targets x candidates, cost ``|p - t_i|``), solved exactly with
    the Hungarian method (``scipy.optimize.linear_sum_assignment``), not greedily. The
    achieved diameter and mean distance of each fit are measured exactly on the
    circulant digraph (a BFS in Z_n: :func:`~topoopt.routing.coin_change.coin_change_table`),
    and the fit with the smallest ``(diameter, mean distance, L1)`` is kept: a small
    diameter is the goal of SelectPermutations (Theorem 1, a Chord-like topology).

    Strides ``p`` and ``n - p`` are the same ring run in opposite directions. Taking
    both makes a full-duplex ring: a hop backwards costs one coin instead of many,
    but it spends a whole port on a generator that adds no new reach beyond a few
    hops. With directed rings, ``m`` distinct forward strides reach up to
    ``C(h + m, m)`` members within ``h`` hops, which grows faster than the
    ``~2^m h^m / m!`` of ``m / 2`` full-duplex pairs once ``h > 2``. So complementary
    pairs are neither forbidden nor preferred: the measured diameter decides, and
    the mirrored targets let a backward ring win where it helps (small groups).

    Examples
    --------
    >>> sel = select_permutations(12, 2)
    >>> sel.strides, sel.diameter
    ((1, 5), 5)
    """
    if int(n) != n or n < 2:
        raise ValueError(f"a ring needs a group of at least 2 members, got n={n}")
    if int(m) != m or m < 1:
        raise ValueError(f"need at least one ring, got m={m}")
    if candidates is not None:
        candidates = tuple(int(p) for p in candidates)
    # a pure function of its arguments, asked again for every group of the same size in
    # every TopologyFinder run of a plan
    return _select_permutations(int(n), int(m), candidates, bool(primes_only), int(variants),
                                int(refine), int(seed))


@functools.lru_cache(maxsize=4096)
def _select_permutations(n: int, m: int, candidates: tuple[int, ...] | None,
                         primes_only: bool, variants: int, refine: int,
                         seed: int) -> PermutationSelection:
    cands = np.asarray(candidates if candidates is not None
                       else totient_perms(n, primes_only), dtype=np.int64)
    if cands.size == 0:
        raise ValueError(f"no candidate strides for n={n}")
    if m >= cands.size:
        # every stride, repeated as parallel rings when the group has degree to spare
        strides = tuple(int(cands[i % cands.size]) for i in range(m))
        diameter, mean = _evaluate(n, strides)
        return PermutationSelection(n, strides, diameter, mean)
    fits = []  # (key, selection) per target
    c_maxes = np.geomspace(max(2.0, n ** 0.5), n, num=max(1, variants)) if m > 1 else [n]
    for c_max in c_maxes:
        base = geometric_targets(m, c_max)
        for mirrored in (False, True):
            target = base.copy()
            if mirrored:
                target[1::2] = n - target[1::2]
            cost = np.abs(cands[None, :] - target[:, None])
            rows, cols = linear_sum_assignment(cost)
            strides = tuple(sorted(int(cands[c]) for c in cols))
            l1 = float(cost[rows, cols].sum())
            diameter, mean = _evaluate(n, strides)
            key = (diameter, round(mean, 12), l1, strides)
            fits.append((key, PermutationSelection(n, strides, diameter, mean,
                                                   tuple(float(t) for t in target), l1)))
    sel = min(fits, key=lambda fit: fit[0])[1]  # the first of the best
    if refine > 0 and m > 1:  # single rings of any coprime stride are isomorphic
        strides, (diameter, mean) = _refine(n, sel.strides, cands, (sel.diameter,
                                            sel.mean_distance), refine, seed)
        sel = PermutationSelection(n, strides, diameter, mean, sel.target, sel.l1)
    return sel
