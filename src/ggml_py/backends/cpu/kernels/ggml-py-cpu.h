// ggml_py's CPU executor in C: kernels, compiled execution plans (cplans) and a thread pool.
//
// The Cython module ggml_py.backends.cpu._executor is the only user of this header. It
// builds a cplan (gp_cplan) for a run of graph nodes once, keeps it while the mutation
// epochs say that nothing it depends on changed, and runs it (gp_cplan_run) with the GIL
// released; nodes whose kernel is written in Python are run by the Cython loop between C
// segments.
//
// The tensor and buffer structs are ggml_py's own, from src/ggml_py/ggml-py-types.h
// (the header _ggml.pxd declares them from), under the kernels' gp_ names.

#pragma once

#include <stddef.h>
#include <stdint.h>

#include "../../../ggml-py-types.h"
#include "../../../ggml-py-vocab.h"
#include "block-quants.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GP_MAX_DIMS      GGML_MAX_DIMS
#define GP_MAX_SRC       GGML_MAX_SRC
#define GP_MAX_OP_PARAMS GGML_MAX_OP_PARAMS     // int32 words
#define GP_MAX_NAME      GGML_MAX_NAME

// ggml_py's data model, the one definition (its Cython side is _ggml.pxd)
typedef ggml_backend_buffer_type gp_buffer_type;
typedef ggml_backend_buffer      gp_buffer;
typedef ggml_tensor              gp_tensor;

// ggml 0.10.1's type ids, GP_TYPE_F32 ... GP_TYPE_MXFP4 (the one list: ggml-py-vocab.h)
#define GP_TYPE_ENUM_(ID, id, name, blck, size, vdt) GP_TYPE_##ID = id,
enum gp_type { GGML_PY_TYPES(GP_TYPE_ENUM_) GP_TYPE_COUNT = GGML_PY_TYPE_COUNT };
#undef GP_TYPE_ENUM_

// ggml 0.10.1's op ids, GP_OP_NONE ... GP_OP_GLU (the one list: ggml-py-vocab.h)
#define GP_OP_ENUM_(NAME) GP_OP_##NAME = GGML_PY_OP_##NAME,
enum gp_op { GGML_PY_OPS(GP_OP_ENUM_) GP_OP_COUNT = GGML_PY_OP_COUNT };
#undef GP_OP_ENUM_

// the ops gp_select_kernel has C kernels for (for some types and layouts; ACC's still
// runs in numpy): the CPU backend's supported ops beside its numpy kernels
#define GP_KERNEL_OPS(X)                                                                   \
    X(DUP) X(ADD) X(SUB) X(MUL) X(DIV) X(SQR) X(SQRT) X(SUM) X(SUM_ROWS) X(MEAN) X(REPEAT)  \
    X(CONCAT) X(NORM) X(RMS_NORM) X(MUL_MAT) X(MUL_MAT_ID) X(SCALE) X(CPY) X(CONT)          \
    X(GET_ROWS) X(SET_ROWS) X(DIAG_MASK_INF) X(SOFT_MAX) X(ROPE) X(CLAMP) X(PAD) X(ARANGE)  \
    X(ARGSORT) X(TOP_K) X(FLASH_ATTN_EXT) X(UNARY) X(GLU)

int gp_op_has_kernel(int op);
// Does the MUL_MAT t go to the active instruction set's GEMM (mul-mat.c)? BLAS leaves
// those to it: the GEMM reads the weights in their own type and is the faster.
int gp_mul_mat_gemm_takes(const gp_tensor * t);

// ---------------------------------------------------------------------------
// instruction sets: the hot loops exist for a baseline x86-64 (or any) CPU, for AVX2 +
// FMA + F16C, and for AVX-512 (F, VL, BW, DQ, VNNI) beside those; the best one the CPU
// has is chosen when the library loads

typedef enum {
    GP_ISA_BASELINE = 0,
    GP_ISA_AVX2     = 1,
    GP_ISA_AVX512   = 2,    // the AVX2 loops with AVX-512's encodings (32 vector registers,
                            // VL/BW/VNNI forms): the same operations, so the same bits
} gp_isa;

int         gp_isa_supported(gp_isa isa);       // does this CPU (and build) have it?
int         gp_isa_set(gp_isa isa);             // 0, or -1 when not supported
gp_isa      gp_isa_get(void);
const char *gp_isa_name(gp_isa isa);

// ---------------------------------------------------------------------------
// element conversions (ggml's CPU numerics; see quants.c)

void gp_f16_to_f32_row(const uint16_t * x, float * y, int64_t n);
void gp_f32_to_f16_row(const float * x, uint16_t * y, int64_t n);
void gp_bf16_to_f32_row(const uint16_t * x, float * y, int64_t n);
void gp_f32_to_bf16_row(const float * x, uint16_t * y, int64_t n);
void gp_round_f16_row(const float * x, float * y, int64_t n);
void gp_round_bf16_row(const float * x, float * y, int64_t n);
void gp_quantize_q8_0_blocks(const float * x, uint8_t * y, int64_t nb, int cpu);
void gp_dequantize_q8_0_blocks(const uint8_t * x, float * y, int64_t nb);
void gp_round_q8_0_blocks(const float * x, float * y, int64_t nb);
void gp_quantize_q4_0_blocks(const float * x, uint8_t * y, int64_t nb);
void gp_dequantize_q4_0_blocks(const uint8_t * x, float * y, int64_t nb);

// the row conversions and dot product of a block type the executor computes with
// (types.c; ggml-cpu's type traits)
typedef struct gp_type_traits {
    gp_to_float_fn   to_float;          // rows -> float32 (dequantize_row_*)
    gp_from_float_fn from_float;        // float32 rows -> the type, ggml-cpu's quantiser
    gp_from_float_fn from_float_ref;    // ggml's reference quantiser (ggml_quantize_chunk)
} gp_type_traits;

const gp_type_traits * gp_get_type_traits(int type);   // NULL: a plain or unknown type
int           gp_vec_dot_type(int type);               // what MUL_MAT converts src1 to
gp_vec_dot_fn gp_vec_dot_of(int type);                 // the active instruction set's dot of
                                                       // weights of this type, or NULL

// ---------------------------------------------------------------------------
// thread pool: n_threads - 1 workers; the caller is thread 0

typedef struct gp_threadpool gp_threadpool;

gp_threadpool * gp_threadpool_new(int n_threads);       // NULL on failure
void            gp_threadpool_free(gp_threadpool * tp);
int             gp_threadpool_n_threads(const gp_threadpool * tp);
int             gp_threadpool_alive(const gp_threadpool * tp);  // 0 in a child of fork()

// ---------------------------------------------------------------------------
// cplans: execution plans of node runs (the scheduler's split plan is another thing)

typedef enum {
    GP_NODE_NOOP   = 0,     // a view op: nothing to compute
    GP_NODE_C      = 1,     // a C kernel
    GP_NODE_PYTHON = 2,     // a kernel written in Python (run by the caller, GIL held)
    GP_NODE_ERROR  = 3,     // cannot run: computing it raises the node's message
} gp_node_kind;

typedef struct gp_params gp_params;
typedef int (*gp_kernel)(const gp_params * p, gp_tensor * dst);

typedef struct gp_cplan_node {
    gp_tensor * t;
    gp_kernel   fn;         // GP_NODE_C only
    int         kind;       // gp_node_kind
    int         n_tasks;    // threads sharing it: 1 (thread 0 alone) or the cplan's n_threads
    size_t      wsize;      // work buffer bytes it needs (all threads together)
} gp_cplan_node;

typedef struct gp_cplan gp_cplan;

// A cplan for the nodes of `nodes`, or NULL when out of memory. Every node is classified
// (gp_cplan_node_at) but the work buffer is only sized: call gp_cplan_finish after the
// caller has turned nodes it runs in Python into GP_NODE_PYTHON.
gp_cplan *      gp_cplan_new(gp_tensor * const * nodes, int n_nodes, int n_threads);
void            gp_cplan_free(gp_cplan * cplan);
gp_cplan_node * gp_cplan_node_at(gp_cplan * cplan, int i);
int             gp_cplan_n_nodes(const gp_cplan * cplan);
const char *    gp_cplan_node_error(const gp_cplan * cplan, int i);    // GP_NODE_ERROR: why
void            gp_cplan_set_error(gp_cplan * cplan, int i, const char * message);
int             gp_cplan_finish(gp_cplan * cplan);                     // 0, -1 out of memory

// Run the C nodes [i0, i1) (no Python nodes in between) on tp (NULL: the caller alone).
// 0 on success; -1 when a kernel failed: gp_cplan_failure tells which node and why.
int          gp_cplan_run(gp_cplan * cplan, int i0, int i1, gp_threadpool * tp);
const char * gp_cplan_failure(const gp_cplan * cplan, int * node);

// the largest node's work: bytes of the cplan's work buffer
size_t gp_cplan_work_size(const gp_cplan * cplan);

// Profiling: with it on, every run adds each C node's wall time on thread 0 (ns) to
// gp_cplan_node_ns (NULL when off). 0, or -1 out of memory.
int             gp_cplan_profile(gp_cplan * cplan, int on);
const int64_t * gp_cplan_node_ns(const gp_cplan * cplan);

// ---------------------------------------------------------------------------
// tensor facts the cplan builder checks

// The byte range [lo, hi) a tensor's elements span from its data pointer; 0 when the
// shape or strides are invalid for its type (a row that is not a whole number of blocks).
int gp_tensor_extent(const gp_tensor * t, size_t * lo, size_t * hi);
int gp_type_known(int type);

#ifdef __cplusplus
}
#endif
