// ggml_py's tensor, buffer type and buffer structs: the one definition. Cython sees them
// through _ggml.pxd (`cdef extern from` this header), the CPU backend's C kernels
// (src/ggml_py/backends/cpu/kernels) include it, so the layout both sides use cannot drift apart.
// The fields follow ggml's (ggml.h, ggml-backend-impl.h) where ggml_py has them.

#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GGML_MAX_DIMS      4
#define GGML_MAX_SRC       10
#define GGML_MAX_OP_PARAMS 16       // int32 words (ggml: 64 bytes)
#define GGML_MAX_NAME      64
#define GGML_PY_FIRST_SOURCES 3     // the source slots in a tensor's first cache line

typedef struct ggml_backend_buffer_type {
    char   name[GGML_MAX_NAME];
    size_t alignment;               // power of two
    size_t max_size;                // SIZE_MAX when unbounded
    int    is_host;
    void * pyobj;                   // the owning BufferType (borrowed)
} ggml_backend_buffer_type;

typedef struct ggml_backend_buffer {
    ggml_backend_buffer_type * buft;
    char *                     base;        // non-null, aligned; fake for simulated buffers
    size_t                     size;
    int                        usage;       // GGML_BACKEND_BUFFER_USAGE_*
    int                        released;    // its memory was given back
    void *                     allocator;   // the graph allocator whose compute buffer it is
    void *                     pyobj;       // the owning Buffer (borrowed)
    uint64_t                   gen;         // mutation epoch of its last release or usage
                                            // change (the scheduler's graph reuse)
} ggml_backend_buffer;

// Aligned to cache lines (the arena's blocks are too), so that the first 64 bytes, which
// hold what the split and the allocator read of every tensor (all of it for tensors of up
// to three sources), are one cache line, and the first 128 all that graph reuse compares
// but a view's offset.
typedef struct __attribute__((aligned(64))) ggml_tensor {
    int32_t               op;                       // ggml_op
    int32_t               flags;                    // GGML_TENSOR_FLAG_*
    int32_t               order;                    // position among the nodes of the graph
                                                    // split last, or the graph allocator's
                                                    // record of it while planning (_alloc.pxd);
                                                    // trusted only where checked
    int16_t               type;                     // ggml_type
    uint16_t              src_mask;                 // bit j set where src[j] is not NULL,
                                                    // kept by every write of a source slot
                                                    // (ggml_py_set_src)
    struct ggml_tensor *  view_src;
    ggml_backend_buffer * buffer;
    char *                data;
    struct ggml_tensor *  src[GGML_MAX_SRC];
    int32_t               layout;                   // id of (type, ne, nb, op_params), kept
                                                    // by every write of them (_core's
                                                    // layout_changed); 0: none
    int32_t               id;                       // index in the owning context
    size_t                view_offs;
    int64_t               ne[GGML_MAX_DIMS];        // elements per dimension
    size_t                nb[GGML_MAX_DIMS];        // stride in bytes per dimension
    int32_t               op_params[GGML_MAX_OP_PARAMS];
    void *                extra;                    // backend-private data
    void *                owner;                    // the owning context struct
    char                  name[GGML_MAX_NAME];
    uint64_t              gen;                      // mutation epoch of the last change
                                                    // through the API (_core's tensor_changed):
                                                    // the scheduler's graph reuse
    uintptr_t             written;                  // the data address at the last write of
                                                    // its bytes (tensor_set, memset, copies:
                                                    // _backend's mark_written), 0 when the
                                                    // allocator took its placement back; it
                                                    // was written where it lies now when
                                                    // this equals data (Scheduler's
                                                    // check_inputs). In the struct's padding:
                                                    // the size stays 384 bytes
} ggml_tensor;

// The source mask of t, from its slots: bit j set where t->src[j] is not NULL. t->src_mask
// holds it (the hot loops walk its set bits instead of testing every slot, and never read
// the slots past the first cache line to learn that they are empty); the writes of source
// slots keep it, through ggml_py_set_src or by scanning anew after a bulk write.
static inline uint16_t ggml_py_scan_sources(const ggml_tensor * t) {
    uint16_t m = 0;
    for (int j = 0; j < GGML_MAX_SRC; j++) {
        m |= (uint16_t)((t->src[j] != NULL) << j);
    }
    return m;
}

static inline void ggml_py_set_src(ggml_tensor * t, int j, ggml_tensor * src) {
    t->src[j] = src;
    t->src_mask = (uint16_t)((t->src_mask & ~(1u << j)) | ((unsigned)(src != NULL) << j));
}

// The tensor whose source slot j `slot` is (the scheduler's rewiring table keeps slots).
static inline ggml_tensor * ggml_py_src_owner(ggml_tensor ** slot, int j) {
    return (ggml_tensor *)((char *)(slot - j) - offsetof(ggml_tensor, src));
}

// A hash set's slot for a key: key % size without a division, the slowest step of a
// lookup (a 64-bit `%` by a runtime size took 2.3 ns in a loop here, this 1.0 ns). With
// magic = floor(2^64 / size) + 1, the high half of key * magic is key / size or one more,
// for any key < 2^63 (a tensor address / 16) and size >= 2, so one correction gives the
// remainder exactly: the slots are ggml's.
static inline uint64_t ggml_py_mod_magic(uint64_t size) {
    return (uint64_t)(((unsigned __int128)1 << 64) / size) + 1;
}

static inline uint64_t ggml_py_mod(uint64_t key, uint64_t magic, uint64_t size) {
    uint64_t q = (uint64_t)(((unsigned __int128)key * magic) >> 64);
    int64_t r = (int64_t)(key - q * size);
    return (uint64_t)(r < 0 ? r + (int64_t)size : r);
}

#ifdef __cplusplus
}
#endif
