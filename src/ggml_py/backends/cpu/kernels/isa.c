// Which compiled hot loops run: chosen by CPUID when the library loads, as numpy and
// ggml's CPU backend do, so one wheel serves every x86-64 CPU. GGML_PY_CPU_ISA=baseline
// or avx2 in the environment (or gp_isa_set) holds them to that level, e.g. to test them.

#include "cpu-impl.h"

#include <stdlib.h>

const gp_simd * gp_simd_active = &gp_simd_baseline;

int gp_isa_supported(gp_isa isa) {
    switch (isa) {
        case GP_ISA_BASELINE:
            return 1;
        case GP_ISA_AVX2:
#if GP_HAVE_AVX2
            __builtin_cpu_init();
            return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                   __builtin_cpu_supports("f16c");
#else
            return 0;
#endif
        case GP_ISA_AVX512:
#if GP_HAVE_AVX2
            return gp_isa_supported(GP_ISA_AVX2) && __builtin_cpu_supports("avx512f") &&
                   __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
                   __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni");
#else
            return 0;
#endif
        default:
            return 0;
    }
}

int gp_isa_set(gp_isa isa) {
    if (!gp_isa_supported(isa)) return -1;
#if GP_HAVE_AVX2
    gp_simd_active = isa == GP_ISA_AVX512 ? &gp_simd_avx512
                   : isa == GP_ISA_AVX2   ? &gp_simd_avx2 : &gp_simd_baseline;
#else
    gp_simd_active = &gp_simd_baseline;
#endif
    return 0;
}

gp_isa gp_isa_get(void) {
#if GP_HAVE_AVX2
    if (gp_simd_active == &gp_simd_avx512) return GP_ISA_AVX512;
    if (gp_simd_active == &gp_simd_avx2) return GP_ISA_AVX2;
#endif
    return GP_ISA_BASELINE;
}

const char * gp_isa_name(gp_isa isa) {
    return isa == GP_ISA_AVX512 ? "avx512" : isa == GP_ISA_AVX2 ? "avx2" : "baseline";
}

// the best the CPU has, or at most GGML_PY_CPU_ISA's
__attribute__((constructor)) static void isa_init(void) {
    const char * want = getenv("GGML_PY_CPU_ISA");
    gp_isa best = GP_ISA_AVX512;
    if (want && strcmp(want, "baseline") == 0) best = GP_ISA_BASELINE;
    if (want && strcmp(want, "avx2") == 0) best = GP_ISA_AVX2;
    for (int i = best; i > GP_ISA_BASELINE && gp_isa_set((gp_isa)i) != 0; i--) {
    }
}
