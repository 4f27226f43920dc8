"""MUL_MAT for large batches: BLAS (numpy's matmul) on the weights converted to float32
a tile at a time.

The C kernels read the weights in their own type and win while a batch is small: a
product then costs as much as reading the weights once. From some batch size on,
BLAS's cache blocking wins even though the weights must be converted first. The tiles
are converted once per compute into one scratch array of at most TILE_BYTES, so no
float32 copy of a whole weight matrix is ever made; src1 gets ggml's rounding to the
weights' dot type first, as in the C kernels.

The batch sizes from which BLAS is used (BLAS_MIN_BATCH, by weight type) were measured
with `python bench/bench_compute.py --crossover` (see there and README.md); BLAS's own
threads follow OPENBLAS_NUM_THREADS, not the backend's n_threads.
"""

import numpy as np

from ggml_py import quants
from ggml_py.backends.cpu.memory import tensor_array
from ggml_py.backends.cpu.numpy_kernels import values

TILE_BYTES = 4 << 20            # float32 weight rows converted at once

# src1 rows from which BLAS beats the C kernels, measured for square weights of 256 to
# 2048 rows at 1 thread each (BLAS time / C time at 32, 64, 128, 256 rows: f32 1.1-1.2,
# 0.9, 0.75-0.9, 0.7-0.8; f16 1.4-2.2, 1.0-1.4, 0.9-1.3, 0.85-1.0; q8_0 and q4_0 1.2-1.4,
# 0.9-1.1, 0.7-0.9, 0.65-0.8). bf16 follows f16.
BLAS_MIN_BATCH = {"f32": 64, "f16": 256, "bf16": 256, "q8_0": 128, "q4_0": 128}
# (the executor applies them: ggml_py.backends.cpu._executor, to MUL_MATs with f32 src1
# rows, except those the instruction set's GEMM takes: q8_0 under AVX-512 VNNI, 3-4x
# BLAS's speed at 128 rows, see gemm-q8.c)


def mul_mat(t):
    """MUL_MAT through BLAS, weights converted a tile of rows at a time."""
    w, x = t.src[0], t.src[1]
    xs = quants.vec_dot_round(w.type, values(x))            # (ne13, ne12, ne11, K)
    raw = tensor_array(w)                                   # (ne03, ne02, M, K or row bytes)
    out = tensor_array(t)                                   # (ne13, ne12, ne11, M)
    m, k = w.ne[1], w.ne[0]
    r2, r3 = x.ne[2] // w.ne[2], x.ne[3] // w.ne[3]
    rows = max(1, min(m, TILE_BYTES // (4 * k)))
    tile = None if w.type == "f32" else np.empty((rows, k), dtype=np.float32)
    for i3 in range(x.ne[3]):
        for i2 in range(x.ne[2]):
            wm = raw[i3 // r3, i2 // r2]
            for m0 in range(0, m, rows):
                m1 = min(m, m0 + rows)
                if tile is None:
                    wt = wm[m0:m1]
                else:
                    wt = quants.to_f32(w.type, wm[m0:m1], out=tile[:m1 - m0])
                np.matmul(xs[i3, i2], wt.T, out=out[i3, i2, :, m0:m1])
