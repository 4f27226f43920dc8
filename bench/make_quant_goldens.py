"""Write tests/data/quants/ggml_block_types.npz: what ggml 0.10.1 itself makes of a fixed
set of rows, for every block type ggml_py computes with. tests/test_block_types.py holds
ggml_py's conversions and dot products to it, bit for bit, on any machine.

    python bench/make_quant_goldens.py          # needs ggml 0.10.1 (pip install ggml-py==0.10.1)

Per type T the file has
    T/ref       ggml_quantize_chunk(T, x)           (the reference quantiser; q8_1: its
                                                     from_float_ref; q8_K has none)
    T/cpu       ggml-cpu's from_float(T, x)         (the CPU quantiser)
    T/raw       random blocks (a valid-scale half and a fully random half)
    T/float     ggml's to_float(T, raw)             (not for q8_1 / q8_K: ggml has none)
    T/dot       ggml-cpu's vec_dot(T row i of ref, vec_dot-type row i of x), weight types
and x, the float32 rows (n = 512 values each) in several distributions.
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ggml_quants_ref import GgmlQuants  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "quants",
                   "ggml_block_types.npz")
TYPES = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q8_1", "q2_K", "q3_K", "q4_K", "q5_K",
         "q6_K", "q8_K", "iq4_nl", "iq4_xs", "mxfp4")
ACTIVATION_TYPES = ("q8_1", "q8_K")         # vec_dot types only: no dot of their own
N = 512


def rows(rng):
    """float32 rows of N values in the distributions that exercise the quantisers."""
    out = [
        rng.uniform(-1, 1, (4, N)),
        rng.standard_normal((4, N)),
        rng.standard_t(2, (2, N)) * 3,                  # heavy tails
        rng.uniform(-1, 1, (2, N)) * 1e-30,             # tiny
        rng.uniform(-6e4, 6e4, (2, N)),                 # large
    ]
    special = np.zeros((4, N))
    special[1] = 0.5                                    # constant
    special[2, 7] = -3.0                                # one nonzero in a zero row
    special[3] = rng.uniform(-1, 1, N)
    special[3, :32] = 0.0                               # a zero block
    special[3, 32:64] = -0.0
    special[3, 256:288] = rng.uniform(0.5, 1, 32)       # one-signed blocks
    out.append(special)
    return np.concatenate(out).astype(np.float32)


def raw_blocks(rng, ref, t, x_bytes):
    """Random blocks of t: half with the scales of real rows (bytes of a quantised row
    with their value bits shuffled), half fully random bytes (any scale, NaN included)."""
    qk, size = ref.block(t)
    n_blocks = x_bytes.shape[1] // size
    real = x_bytes[:4].copy()
    noise = rng.integers(0, 256, real.shape, dtype=np.uint8)
    # keep the first 4 bytes of each block (most types' scales live there), randomise the rest
    mask = np.tile(np.arange(size) >= 4, n_blocks)
    real[:, mask] = noise[:, mask]
    wild = rng.integers(0, 256, (4, x_bytes.shape[1]), dtype=np.uint8)
    return np.concatenate([real, wild])


def main():
    ref = GgmlQuants()
    rng = np.random.default_rng(30)
    x = rows(rng)
    data = {"x": x}
    for t in TYPES:
        # (ggml has no reference quantiser for q8_K and no to_float for q8_1 / q8_K)
        quantised = (ref.from_float(t, x) if t == "q8_K" else ref.quantize_ref(t, x)
                     if t in ACTIVATION_TYPES else ref.quantize_chunk(t, x))
        if t != "q8_K":
            data[f"{t}/ref"] = quantised
        data[f"{t}/cpu"] = ref.from_float(t, x)
        if t not in ACTIVATION_TYPES:
            raw = raw_blocks(rng, ref, t, quantised)
            data[f"{t}/raw"] = raw
            data[f"{t}/float"] = ref.to_float(t, raw)
        if t not in ACTIVATION_TYPES:
            v = ref.vec_dot_type(t)
            y = ref.from_float(v, x[::-1].copy())
            data[f"{t}/dot"] = np.array([ref.vec_dot(t, quantised[i], y[i], N)
                                         for i in range(len(x))], np.float32)
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    np.savez_compressed(OUT, **data)
    print(f"{OUT}: {os.path.getsize(OUT)} bytes, {len(TYPES)} types")


if __name__ == "__main__":
    main()
