// What the CPU executor knows of each element type: its layout (from the one list,
// ggml-py-vocab.h) and, for the block types it computes with, the row conversions
// (ggml-cpu's type traits). MUL_MAT reads f32 / f16 / bf16 / q8_0 / q4_0 weights with the
// dot tiles of the active instruction set's table (simd.c), the others with its vec_dot.

#include "cpu-impl.h"

#define TYPE_BLCK_(ID, id, name, blck, size, vdt) [id] = blck,
#define TYPE_SIZE_(ID, id, name, blck, size, vdt) [id] = size,
#define TYPE_VDT_(ID, id, name, blck, size, vdt)  [id] = GP_TYPE_##vdt,
static const int64_t type_blck[GP_TYPE_COUNT] = { GGML_PY_TYPES(TYPE_BLCK_) };
static const size_t  type_size[GP_TYPE_COUNT] = { GGML_PY_TYPES(TYPE_SIZE_) };
static const int     type_vdt[GP_TYPE_COUNT]  = { GGML_PY_TYPES(TYPE_VDT_) };

// q8_0 and q4_0 keep their block-count forms in quants.c; the traits take elements
static void q8_0_to_float(const void * x, float * y, int64_t n) { gp_dequantize_q8_0_blocks(x, y, n / QK8_0); }
static void q8_0_from_float(const float * x, void * y, int64_t n) { gp_quantize_q8_0_blocks(x, y, n / QK8_0, 1); }
static void q8_0_from_float_ref(const float * x, void * y, int64_t n) { gp_quantize_q8_0_blocks(x, y, n / QK8_0, 0); }
static void q4_0_to_float(const void * x, float * y, int64_t n) { gp_dequantize_q4_0_blocks(x, y, n / QK4_0); }
static void q4_0_from_float(const float * x, void * y, int64_t n) { gp_quantize_q4_0_blocks(x, y, n / QK4_0); }

#define CONVERSIONS(T) gp_dequantize_row_##T, gp_quantize_row_##T, gp_quantize_row_##T##_ref

static const gp_type_traits traits[GP_TYPE_COUNT] = {
    [GP_TYPE_Q8_0]   = { q8_0_to_float, q8_0_from_float, q8_0_from_float_ref },
    [GP_TYPE_Q4_0]   = { q4_0_to_float, q4_0_from_float, q4_0_from_float },
    [GP_TYPE_Q4_1]   = { CONVERSIONS(q4_1) },
    [GP_TYPE_Q5_0]   = { CONVERSIONS(q5_0) },
    [GP_TYPE_Q5_1]   = { CONVERSIONS(q5_1) },
    [GP_TYPE_Q8_1]   = { CONVERSIONS(q8_1) },
    [GP_TYPE_Q2_K]   = { CONVERSIONS(q2_K) },
    [GP_TYPE_Q3_K]   = { CONVERSIONS(q3_K) },
    [GP_TYPE_Q4_K]   = { CONVERSIONS(q4_K) },
    [GP_TYPE_Q5_K]   = { CONVERSIONS(q5_K) },
    [GP_TYPE_Q6_K]   = { CONVERSIONS(q6_K) },
    [GP_TYPE_Q8_K]   = { CONVERSIONS(q8_K) },
    [GP_TYPE_IQ4_NL] = { CONVERSIONS(iq4_nl) },
    [GP_TYPE_IQ4_XS] = { CONVERSIONS(iq4_xs) },
    [GP_TYPE_MXFP4]  = { CONVERSIONS(mxfp4) },
};

static int in_range(int type) { return type >= 0 && type < GP_TYPE_COUNT; }

const gp_type_traits * gp_get_type_traits(int type) {
    return in_range(type) && traits[type].to_float ? &traits[type] : NULL;
}

size_t gp_type_size(int type) { return in_range(type) && type_blck[type] ? type_size[type] : 0; }
int64_t gp_blck_size(int type) { return in_range(type) && type_blck[type] ? type_blck[type] : 1; }
int gp_vec_dot_type(int type) { return in_range(type) ? type_vdt[type] : GP_TYPE_F32; }
int gp_is_quant(int type) { return in_range(type) && type_blck[type] > 1; }

// a type whose rows the executor can read: the plain types and the block types it
// converts (the layouts of tq1_0 / tq2_0 are known, their numerics are not)
int gp_type_known(int type) {
    return gp_type_size(type) != 0 && (!gp_is_quant(type) || gp_get_type_traits(type) != NULL);
}

size_t gp_row_size(int type, int64_t ne) {
    return gp_type_size(type) * (size_t)(ne / gp_blck_size(type));
}

gp_vec_dot_fn gp_vec_dot_of(int type) {
    return in_range(type) ? gp_simd_active->vec_dot[type] : NULL;
}
