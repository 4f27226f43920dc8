// Tensor facts and rows of the CPU executor: type sizes, contiguity, and rows of any
// float type read as float32 / written from float32 (with ggml's CPU conversions).

#include "cpu-impl.h"

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
        default:
            if (gp_get_type_traits(type)) gp_get_type_traits(type)->to_float(x, tmp, n);  // packed
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
        default:
            if (gp_get_type_traits(type)) gp_get_type_traits(type)->from_float(x, y, n);  // packed
            break;
    }
}
