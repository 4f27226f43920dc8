# The CPU executor's C library (src/ggml_py/backends/cpu/kernels) as Cython sees it, and the row
# conversions it exports to other modules (ggml_py._quants cimports them, so the
# process holds one copy of the library and one choice of instruction set).
# See _executor.pyx for details.

from libc.stdint cimport int64_t, uint8_t, uint16_t

cdef extern from "ggml_py/backends/cpu/kernels/ggml-py-cpu.h" nogil:
    ctypedef struct gp_tensor:
        pass
    ctypedef struct gp_threadpool:
        pass
    ctypedef struct gp_cplan:
        pass

    ctypedef enum gp_isa:
        GP_ISA_BASELINE
        GP_ISA_AVX2
        GP_ISA_AVX512

    ctypedef enum gp_node_kind:
        GP_NODE_NOOP
        GP_NODE_C
        GP_NODE_PYTHON
        GP_NODE_ERROR

    ctypedef struct gp_cplan_node:
        gp_tensor * t
        int kind
        int n_tasks
        size_t wsize

    int gp_isa_supported(gp_isa isa)
    int gp_isa_set(gp_isa isa)
    gp_isa gp_isa_get()
    const char * gp_isa_name(gp_isa isa)
    int gp_mul_mat_gemm_takes(const gp_tensor * t)

    void gp_f16_to_f32_row(const uint16_t * x, float * y, int64_t n)
    void gp_f32_to_f16_row(const float * x, uint16_t * y, int64_t n)
    void gp_bf16_to_f32_row(const uint16_t * x, float * y, int64_t n)
    void gp_f32_to_bf16_row(const float * x, uint16_t * y, int64_t n)
    void gp_round_f16_row(const float * x, float * y, int64_t n)
    void gp_round_bf16_row(const float * x, float * y, int64_t n)
    void gp_quantize_q8_0_blocks(const float * x, uint8_t * y, int64_t nb, int cpu)
    void gp_dequantize_q8_0_blocks(const uint8_t * x, float * y, int64_t nb)
    void gp_round_q8_0_blocks(const float * x, float * y, int64_t nb)
    void gp_quantize_q4_0_blocks(const float * x, uint8_t * y, int64_t nb)
    void gp_dequantize_q4_0_blocks(const uint8_t * x, float * y, int64_t nb)

    gp_threadpool * gp_threadpool_new(int n_threads)
    void gp_threadpool_free(gp_threadpool * tp)
    int gp_threadpool_alive(const gp_threadpool * tp)

    gp_cplan * gp_cplan_new(gp_tensor * const * nodes, int n_nodes, int n_threads)
    void gp_cplan_free(gp_cplan * cplan)
    gp_cplan_node * gp_cplan_node_at(gp_cplan * cplan, int i)
    int gp_cplan_n_nodes(const gp_cplan * cplan)
    const char * gp_cplan_node_error(const gp_cplan * cplan, int i)
    void gp_cplan_set_error(gp_cplan * cplan, int i, const char * message)
    int gp_cplan_finish(gp_cplan * cplan)
    int gp_cplan_run(gp_cplan * cplan, int i0, int i1, gp_threadpool * tp)
    const char * gp_cplan_failure(const gp_cplan * cplan, int * node)
    size_t gp_cplan_work_size(const gp_cplan * cplan)
    int gp_cplan_profile(gp_cplan * cplan, int on)
    const int64_t * gp_cplan_node_ns(const gp_cplan * cplan)

    int gp_tensor_extent(const gp_tensor * t, size_t * lo, size_t * hi)
    int gp_type_known(int type)

    ctypedef void (*gp_to_float_fn)(const void * x, float * y, int64_t n)
    ctypedef void (*gp_from_float_fn)(const float * x, void * y, int64_t n)
    ctypedef void (*gp_vec_dot_fn)(int64_t n, float * s, const void * x, const void * y)
    ctypedef struct gp_type_traits:
        gp_to_float_fn to_float
        gp_from_float_fn from_float
        gp_from_float_fn from_float_ref
    const gp_type_traits * gp_get_type_traits(int type)
    int gp_vec_dot_type(int type)
    gp_vec_dot_fn gp_vec_dot_of(int type)

# row conversions for ggml_py._quants (one instance of the library in the process)
ctypedef void (*u16_to_f32_row)(const uint16_t *, float *, int64_t) noexcept nogil
ctypedef void (*f32_to_u16_row)(const float *, uint16_t *, int64_t) noexcept nogil
ctypedef void (*f32_to_f32_row)(const float *, float *, int64_t) noexcept nogil
ctypedef void (*f32_to_blocks)(const float *, uint8_t *, int64_t, int) noexcept nogil
ctypedef void (*blocks_to_f32)(const uint8_t *, float *, int64_t) noexcept nogil

cdef struct conversions:
    u16_to_f32_row f16_to_f32
    f32_to_u16_row f32_to_f16
    u16_to_f32_row bf16_to_f32
    f32_to_u16_row f32_to_bf16
    f32_to_f32_row round_f16
    f32_to_f32_row round_bf16
    f32_to_blocks  quantize_q8_0          # (x, y, n_blocks, cpu)
    blocks_to_f32  dequantize_q8_0
    f32_to_f32_row round_q8_0             # n = blocks
    f32_to_blocks  quantize_q4_0          # (cpu ignored: the reference quantiser)
    blocks_to_f32  dequantize_q4_0
    # every block type the executor computes with, by ggml type id
    const gp_type_traits * (*type_traits)(int) noexcept nogil     # NULL: none
    int (*vec_dot_type)(int) noexcept nogil
    gp_vec_dot_fn (*vec_dot_of)(int) noexcept nogil

cdef const conversions * get_conversions() noexcept
