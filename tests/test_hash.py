"""The hash set on tensor pointers (ggml-impl.h / ggml.c) and ggml_hash_size."""

import bisect
from collections import defaultdict

import pytest
from hypothesis import given, strategies as st

from ggml_py import Context, GraphError, HashSet, hash_size

# ggml.c, ggml_hash_size: the next primes after powers of two
GGML_PRIMES = [
    2, 3, 5, 11, 17, 37, 67, 131, 257, 521, 1031, 2053, 4099, 8209, 16411, 32771, 65537,
    131101, 262147, 524309, 1048583, 2097169, 4194319, 8388617, 16777259, 33554467, 67108879,
    134217757, 268435459, 536870923, 1073741827, 2147483659,
]


def ref_hash_size(min_sz):
    """Smallest prime of the table >= min_sz; past the table, min_sz | 1."""
    i = bisect.bisect_left(GGML_PRIMES, min_sz)
    return GGML_PRIMES[i] if i < len(GGML_PRIMES) else min_sz | 1


@pytest.mark.parametrize("n, expected", [
    (0, 2), (1, 2), (2, 2), (3, 3), (4, 5), (5, 5), (6, 11), (12, 17), (1031, 1031),
    (1032, 2053), (2048, 2053), (4096, 4099), (2147483659, 2147483659),
    (2147483660, 2147483661), (2**40, 2**40 + 1), (2**40 + 1, 2**40 + 1),
])
def test_hash_size_table(n, expected):
    assert hash_size(n) == expected


def test_hash_size_at_every_prime_boundary():
    for p in GGML_PRIMES:
        assert hash_size(p) == p
        assert hash_size(p - 1) == (p - 1 if p - 1 in GGML_PRIMES else p)
        assert hash_size(p + 1) == ref_hash_size(p + 1) > p


@given(st.integers(0, 2**48))
def test_hash_size_matches_reference(n):
    assert hash_size(n) == ref_hash_size(n)


def _tensors(n):
    ctx = Context()
    return [ctx.new_tensor("f32", (4,), name=f"t{i}") for i in range(n)]


def _by_home_slot(tensors, size):
    probe = HashSet(size)
    homes = defaultdict(list)
    for t in tensors:
        homes[probe.slot_of_hash(t)].append(t)
    return homes


@pytest.mark.parametrize("size", [2, 3, 17, 4099, 2147483659, 2**40 + 1, 2**62 + 1, 2**63 - 1])
def test_home_slot_is_the_remainder_at_the_extremes(size):
    # lookups take key % size by a multiply and one correction, never a division
    for key in (0, 1, size - 1, size, size + 1, 2 * size - 1, 2**44 + 7, 2**63 - 1,
                (2**63 - 1) // size * size, (2**63 - 1) // size * size - 1):
        if 0 <= key < 2**63:
            assert HashSet.home_of_key(key, size) == key % size


@given(st.integers(0, 2**63 - 1), st.integers(2, 2**63 - 1))
def test_home_slot_is_the_remainder(key, size):
    assert HashSet.home_of_key(key, size) == key % size


def test_home_slot_rejects_what_it_cannot_compute():
    with pytest.raises(ValueError):
        HashSet.home_of_key(2**63, 11)
    with pytest.raises(ValueError):
        HashSet.home_of_key(5, 1)


def test_size_is_hash_size():
    for n in (1, 5, 100, 3000):
        assert HashSet(n).size == hash_size(n)


def test_fill_completely_then_overflow():
    ts = _tensors(12)
    hs = HashSet(11)
    assert hs.size == 11
    slots = [hs.insert(t) for t in ts[:11]]
    assert sorted(slots) == list(range(11))         # every slot used once
    assert len(hs) == 11
    for t, slot in zip(ts[:11], slots):
        assert t in hs and hs.find(t) == slot
    assert hs.insert(ts[0]) is None                 # already there
    assert ts[11] not in hs and hs.find(ts[11]) is None
    with pytest.raises(GraphError, match="11 slots"):
        hs.insert(ts[11])
    hs.reset()
    assert len(hs) == 0 and not any(t in hs for t in ts)
    assert hs.insert(ts[11]) is not None


def test_collisions_probe_by_the_keys_own_step():
    # a key whose home is taken moves on by a step drawn from itself (double hashing:
    # keys that meet scatter instead of piling into one run)
    ts = _tensors(400)
    size = 17
    homes = _by_home_slot(ts, size)
    h, group = next((h, g) for h, g in sorted(homes.items()) if len(g) >= 3)
    hs = HashSet(size)
    steps = [hs.probe_step(t) for t in group[:3]]
    assert all(1 <= k < size for k in steps)
    assert hs.insert(group[0]) == h
    second = hs.insert(group[1])
    assert second == (h + steps[1]) % size
    third = hs.find(group[2])
    expect = (h + steps[2]) % size
    if expect == second:                            # met the second one too
        expect = (expect + steps[2]) % size
    assert third == expect and hs.insert(group[2]) == expect
    for t, slot in zip(group[:3], (h, second, expect)):
        assert hs.find(t) == slot and t in hs


def test_probing_wraps_around():
    ts = _tensors(400)
    # a prime whose last slot is home to two tensors (the arena's tensor stride, a
    # multiple of 16 bytes, makes every tensor hash alike modulo a prime dividing it)
    size = next(p for p in range(11, 200) if HashSet(p).size == p
                and len(_by_home_slot(ts, p)[p - 1]) >= 2)
    last = _by_home_slot(ts, size)[size - 1]
    hs = HashSet(size)
    assert hs.insert(last[0]) == size - 1
    slot = hs.insert(last[1])
    assert slot == hs.probe_step(last[1]) - 1       # wrapped past the end
    assert hs.find(last[1]) == slot and last[1] in hs


@given(st.lists(st.integers(0, 199), max_size=60), st.integers(1, 80))
def test_set_semantics(picks, min_size):
    ts = _tensors(200)
    hs = HashSet(min_size)
    inserted = set()
    for i in picks:
        if i in inserted:
            assert hs.insert(ts[i]) is None
        elif len(inserted) == hs.size:
            with pytest.raises(GraphError):
                hs.insert(ts[i])
        else:
            slot = hs.insert(ts[i])
            assert 0 <= slot < hs.size
            inserted.add(i)
    assert len(hs) == len(inserted)
    for i in range(200):
        assert (ts[i] in hs) == (i in inserted)
