// Tensor facts and rows of the CPU executor: type sizes, contiguity, and rows of any
// float type read as float32 / written from float32 (with ggml's CPU conversions).

#include "cpu-impl.h"

size_t gp_type_size(int type) {
    switch (type) {
        case GP_TYPE_F32:  case GP_TYPE_I32:  return 4;
        case GP_TYPE_F16:  case GP_TYPE_BF16: case GP_TYPE_I16: return 2;
        case GP_TYPE_I8:   return 1;
        case GP_TYPE_I64:  case GP_TYPE_F64:  return 8;
        case GP_TYPE_Q8_0: return Q8_0_BYTES;
        case GP_TYPE_Q4_0: return Q4_0_BYTES;
        default:           return 0;
    }
}

int64_t gp_blck_size(int type) {
    return type == GP_TYPE_Q8_0 || type == GP_TYPE_Q4_0 ? 32 : 1;
}

int gp_type_known(int type) { return gp_type_size(type) != 0; }

size_t gp_row_size(int type, int64_t ne) {
    return gp_type_size(type) * (size_t)(ne / gp_blck_size(type));
}

int gp_same_shape(const gp_tensor * a, const gp_tensor * b) {
    return a->ne[0] == b->ne[0] && a->ne[1] == b->ne[1] && a->ne[2] == b->ne[2] && a->ne[3] == b->ne[3];
}

int gp_is_contiguous(const gp_tensor * t) {
    size_t next = gp_type_size(t->type);
    if (t->ne[0] != gp_blck_size(t->type) && t->nb[0] != next) return 0;
    next *= (size_t)(t->ne[0] / gp_blck_size(t->type));
    for (int i = 1; i < GP_MAX_DIMS; i++) {
        if (t->ne[i] != 1) {
            if (t->nb[i] != next) return 0;
            next *= (size_t)t->ne[i];
        }
    }
    return 1;
}

const float * gp_load_row(int type, const char * x, size_t nb0, int64_t n, float * tmp) {
    switch (type) {
        case GP_TYPE_F32:
            if (nb0 == sizeof(float)) return (const float *)x;
            for (int64_t i = 0; i < n; i++) tmp[i] = *(const float *)(x + i * nb0);
            return tmp;
        case GP_TYPE_F16:
            if (nb0 == 2) gp_f16_to_f32_row((const uint16_t *)x, tmp, n);
            else for (int64_t i = 0; i < n; i++) tmp[i] = gp_h2f(*(const uint16_t *)(x + i * nb0));
            return tmp;
        case GP_TYPE_BF16:
            for (int64_t i = 0; i < n; i++) tmp[i] = gp_bf2f(*(const uint16_t *)(x + i * nb0));
            return tmp;
        case GP_TYPE_Q8_0:
            gp_dequantize_q8_0_blocks((const uint8_t *)x, tmp, n / QK8_0);
            return tmp;
        case GP_TYPE_Q4_0:
            gp_dequantize_q4_0_blocks((const uint8_t *)x, tmp, n / QK4_0);
            return tmp;
        default:
            return tmp;
    }
}

void gp_store_row(int type, char * y, size_t nb0, const float * x, int64_t n) {
    switch (type) {
        case GP_TYPE_F32:
            if (nb0 == sizeof(float)) {
                if ((const char *)x != y) memmove(y, x, (size_t)n * sizeof(float));
            } else {
                for (int64_t i = 0; i < n; i++) *(float *)(y + i * nb0) = x[i];
            }
            break;
        case GP_TYPE_F16:
            if (nb0 == 2) gp_f32_to_f16_row(x, (uint16_t *)y, n);
            else for (int64_t i = 0; i < n; i++) *(uint16_t *)(y + i * nb0) = gp_f2h(x[i]);
            break;
        case GP_TYPE_BF16:
            for (int64_t i = 0; i < n; i++) *(uint16_t *)(y + i * nb0) = gp_f2bf(x[i]);
            break;
        case GP_TYPE_Q8_0:
            gp_quantize_q8_0_blocks(x, (uint8_t *)y, n / QK8_0, 1);
            break;
        case GP_TYPE_Q4_0:
            gp_quantize_q4_0_blocks(x, (uint8_t *)y, n / QK4_0);
            break;
        default:
            break;
    }
}
