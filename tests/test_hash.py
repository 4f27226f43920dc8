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


def test_collisions_draw_slots_from_the_key():
    # a key whose home is taken tries slots drawn from itself, the same on every
    # lookup (keys that meet scatter instead of piling into one run)
    ts = _tensors(400)
    size = 17
    homes = _by_home_slot(ts, size)
    h, group = next((h, g) for h, g in sorted(homes.items()) if len(g) >= 3)
    hs = HashSet(size)
    assert hs.insert(group[0]) == h
    for t in group[1:3]:
        path = hs.probe_slots(t, 40)
        assert path[0] == h and all(0 <= i < size for i in path)
        expect = next(i for i in path if hs.find(t) == i)
        assert expect == next(i for i in path if i not in {hs.find(u) for u in group if u in hs})
        assert hs.insert(t) == expect and hs.find(t) == expect and t in hs
    assert hs.probe_slots(group[1], 40) == hs.probe_slots(group[1], 40)


def test_probing_walks_the_whole_table_after_its_draws():
    # past its draws a lookup steps round the table by a step of its own (wrapping past
    # the end), reaching every slot: a set fills to its last slot and a full one says so
    ts = _tensors(40)
    hs = HashSet(37)
    slots = [hs.insert(t) for t in ts[:37]]
    assert sorted(slots) == list(range(37))
    t = ts[37]
    walk = hs.probe_slots(t, 33 + 37)[32:]
    step = (walk[1] - walk[0]) % 37
    assert 1 <= step < 37
    assert all((b - a) % 37 == step for a, b in zip(walk, walk[1:]))
    assert sorted(walk[1:]) == list(range(37))                     # every slot once
    assert hs.find(t) is None


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
