# The C data model of ggml_py: ggml's tensor, graph, hash set, buffer type,
# buffer and backend structs, laid out for the scheduler and the allocator.
# Declarations only; the logic lives in _core, _backend, _sched and _alloc.
# The tensor, buffer type and buffer structs are defined once, in C
# (ggml-py-types.h), which the CPU backend's C kernels include too.

from libc.stdint cimport int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t, uintptr_t

cdef extern from "ggml_py/ggml-py-types.h":
    enum:
        GGML_MAX_DIMS
        GGML_MAX_SRC
        GGML_MAX_OP_PARAMS      # int32 words (ggml: 64 bytes)
        GGML_MAX_NAME
        GGML_PY_FIRST_SOURCES   # the source slots in a tensor's first cache line

    ctypedef struct ggml_backend_buffer_type:
        char name[GGML_MAX_NAME]
        size_t alignment
        size_t max_size
        bint is_host
        void * pyobj

    ctypedef struct ggml_backend_buffer:
        ggml_backend_buffer_type * buft
        char * base
        size_t size
        int usage
        bint released
        void * allocator
        void * pyobj
        uint64_t gen

    ctypedef struct ggml_tensor:
        int32_t op
        int32_t flags
        int32_t order
        int32_t layout
        ggml_tensor * src[GGML_MAX_SRC]
        ggml_tensor * view_src
        ggml_backend_buffer * buffer
        char * data
        size_t view_offs
        int16_t type
        uint16_t src_mask               # (ggml_py_set_src keeps it)
        int32_t id
        int64_t ne[GGML_MAX_DIMS]
        size_t nb[GGML_MAX_DIMS]
        int32_t op_params[GGML_MAX_OP_PARAMS]
        void * extra
        void * owner
        char name[GGML_MAX_NAME]
        uint64_t gen
        uintptr_t written

# ggml's element types, listed once (ggml-py-vocab.h)
cdef extern from "ggml_py/ggml-py-vocab.h":
    enum:
        GGML_PY_TYPE_COUNT
        GGML_PY_N_TYPE_INFOS
    # the type ids Cython code names (ggml's GGML_TYPE_*): the header gives their values
    enum:
        TYPE_F32 "GGML_PY_TYPE_F32"
        TYPE_F16 "GGML_PY_TYPE_F16"
        TYPE_Q8_0 "GGML_PY_TYPE_Q8_0"
        TYPE_I16 "GGML_PY_TYPE_I16"
        TYPE_I32 "GGML_PY_TYPE_I32"
        TYPE_I64 "GGML_PY_TYPE_I64"
        TYPE_BF16 "GGML_PY_TYPE_BF16"
        TYPE_IQ1_M "GGML_PY_TYPE_IQ1_M"
        TYPE_IQ1_S "GGML_PY_TYPE_IQ1_S"
        TYPE_IQ2_S "GGML_PY_TYPE_IQ2_S"
        TYPE_IQ2_XS "GGML_PY_TYPE_IQ2_XS"
        TYPE_IQ2_XXS "GGML_PY_TYPE_IQ2_XXS"
        TYPE_IQ3_S "GGML_PY_TYPE_IQ3_S"
        TYPE_IQ3_XXS "GGML_PY_TYPE_IQ3_XXS"
        TYPE_IQ4_NL "GGML_PY_TYPE_IQ4_NL"
        TYPE_IQ4_XS "GGML_PY_TYPE_IQ4_XS"
        TYPE_MXFP4 "GGML_PY_TYPE_MXFP4"
        TYPE_NVFP4 "GGML_PY_TYPE_NVFP4"
        TYPE_Q1_0 "GGML_PY_TYPE_Q1_0"
        TYPE_Q2_K "GGML_PY_TYPE_Q2_K"
        TYPE_Q3_K "GGML_PY_TYPE_Q3_K"
        TYPE_Q4_0 "GGML_PY_TYPE_Q4_0"
        TYPE_Q4_1 "GGML_PY_TYPE_Q4_1"
        TYPE_Q4_K "GGML_PY_TYPE_Q4_K"
        TYPE_Q5_0 "GGML_PY_TYPE_Q5_0"
        TYPE_Q5_1 "GGML_PY_TYPE_Q5_1"
        TYPE_Q5_K "GGML_PY_TYPE_Q5_K"
        TYPE_Q6_K "GGML_PY_TYPE_Q6_K"
        TYPE_Q8_1 "GGML_PY_TYPE_Q8_1"
        TYPE_Q8_K "GGML_PY_TYPE_Q8_K"
        TYPE_TQ1_0 "GGML_PY_TYPE_TQ1_0"
        TYPE_TQ2_0 "GGML_PY_TYPE_TQ2_0"

    ctypedef struct ggml_py_type_info:
        int id
        const char * name
        int64_t blck_size               # 0: known by name only
        size_t type_size
        int vec_dot_type

    const ggml_py_type_info ggml_py_type_infos[]

    # ops, unary ops and GLU ops by id
    enum:
        GGML_PY_OP_COUNT
        GGML_PY_UNARY_OP_COUNT
        GGML_PY_GLU_OP_COUNT
    const char * const ggml_py_op_names[]
    const char * const ggml_py_unary_op_names[]
    const char * const ggml_py_glu_op_names[]

    # the op, unary op and GLU op ids Cython code names (ggml's GGML_OP_*, GGML_UNARY_OP_*,
    # GGML_GLU_OP_*): declared by name only, the header gives their values
    enum:
        OP_NONE "GGML_PY_OP_NONE"
        OP_DUP "GGML_PY_OP_DUP"
        OP_ADD "GGML_PY_OP_ADD"
        OP_ACC "GGML_PY_OP_ACC"
        OP_SUB "GGML_PY_OP_SUB"
        OP_MUL "GGML_PY_OP_MUL"
        OP_DIV "GGML_PY_OP_DIV"
        OP_SQR "GGML_PY_OP_SQR"
        OP_SQRT "GGML_PY_OP_SQRT"
        OP_LOG "GGML_PY_OP_LOG"
        OP_SIN "GGML_PY_OP_SIN"
        OP_COS "GGML_PY_OP_COS"
        OP_SUM "GGML_PY_OP_SUM"
        OP_SUM_ROWS "GGML_PY_OP_SUM_ROWS"
        OP_CUMSUM "GGML_PY_OP_CUMSUM"
        OP_MEAN "GGML_PY_OP_MEAN"
        OP_ARGMAX "GGML_PY_OP_ARGMAX"
        OP_REPEAT "GGML_PY_OP_REPEAT"
        OP_CONCAT "GGML_PY_OP_CONCAT"
        OP_NORM "GGML_PY_OP_NORM"
        OP_RMS_NORM "GGML_PY_OP_RMS_NORM"
        OP_MUL_MAT "GGML_PY_OP_MUL_MAT"
        OP_MUL_MAT_ID "GGML_PY_OP_MUL_MAT_ID"
        OP_SCALE "GGML_PY_OP_SCALE"
        OP_CPY "GGML_PY_OP_CPY"
        OP_CONT "GGML_PY_OP_CONT"
        OP_RESHAPE "GGML_PY_OP_RESHAPE"
        OP_VIEW "GGML_PY_OP_VIEW"
        OP_PERMUTE "GGML_PY_OP_PERMUTE"
        OP_TRANSPOSE "GGML_PY_OP_TRANSPOSE"
        OP_GET_ROWS "GGML_PY_OP_GET_ROWS"
        OP_SET_ROWS "GGML_PY_OP_SET_ROWS"
        OP_DIAG_MASK_INF "GGML_PY_OP_DIAG_MASK_INF"
        OP_SOFT_MAX "GGML_PY_OP_SOFT_MAX"
        OP_ROPE "GGML_PY_OP_ROPE"
        OP_ROPE_BACK "GGML_PY_OP_ROPE_BACK"
        OP_CLAMP "GGML_PY_OP_CLAMP"
        OP_PAD "GGML_PY_OP_PAD"
        OP_ARANGE "GGML_PY_OP_ARANGE"
        OP_TIMESTEP_EMBEDDING "GGML_PY_OP_TIMESTEP_EMBEDDING"
        OP_ARGSORT "GGML_PY_OP_ARGSORT"
        OP_TOP_K "GGML_PY_OP_TOP_K"
        OP_LEAKY_RELU "GGML_PY_OP_LEAKY_RELU"
        OP_FLASH_ATTN_EXT "GGML_PY_OP_FLASH_ATTN_EXT"
        OP_UNARY "GGML_PY_OP_UNARY"
        OP_GLU "GGML_PY_OP_GLU"
        OP_ADD_ID "GGML_PY_OP_ADD_ID"
        OP_DIAG "GGML_PY_OP_DIAG"
        OP_FILL "GGML_PY_OP_FILL"
        OP_GROUP_NORM "GGML_PY_OP_GROUP_NORM"
        OP_L2_NORM "GGML_PY_OP_L2_NORM"
        OP_OUT_PROD "GGML_PY_OP_OUT_PROD"
        OP_ROLL "GGML_PY_OP_ROLL"
        OP_SET "GGML_PY_OP_SET"
        OP_TRI "GGML_PY_OP_TRI"
        OP_UPSCALE "GGML_PY_OP_UPSCALE"
        UNARY_OP_GELU "GGML_PY_UNARY_OP_GELU"
        UNARY_OP_GELU_QUICK "GGML_PY_UNARY_OP_GELU_QUICK"
        UNARY_OP_SILU "GGML_PY_UNARY_OP_SILU"
        UNARY_OP_GELU_ERF "GGML_PY_UNARY_OP_GELU_ERF"
        GLU_OP_SWIGLU_OAI "GGML_PY_GLU_OP_SWIGLU_OAI"
        UNARY_OP_EXP "GGML_PY_UNARY_OP_EXP"
        UNARY_OP_EXPM1 "GGML_PY_UNARY_OP_EXPM1"
        UNARY_OP_NEG "GGML_PY_UNARY_OP_NEG"
        UNARY_OP_RELU "GGML_PY_UNARY_OP_RELU"
        UNARY_OP_SIGMOID "GGML_PY_UNARY_OP_SIGMOID"
        UNARY_OP_SOFTPLUS "GGML_PY_UNARY_OP_SOFTPLUS"
        UNARY_OP_TANH "GGML_PY_UNARY_OP_TANH"
        UNARY_OP_XIELU "GGML_PY_UNARY_OP_XIELU"

    # named values: rope modes and precisions (enum ggml_prec)
    enum:
        GGML_PY_N_ROPE_TYPES
        GGML_PY_ROPE_TYPE_NORMAL
        GGML_PY_ROPE_TYPE_NEOX
        GGML_PY_ROPE_TYPE_MROPE
        GGML_PY_ROPE_TYPE_VISION
        GGML_PY_N_PRECS
        GGML_PY_PREC_DEFAULT
        GGML_PY_PREC_F32
    const char * const ggml_py_rope_type_names[]
    const int ggml_py_rope_type_values[]
    const char * const ggml_py_prec_names[]
    const int ggml_py_prec_values[]

# tensor flags (ggml_tensor_flag)
cdef enum:
    GGML_TENSOR_FLAG_INPUT = 1
    GGML_TENSOR_FLAG_OUTPUT = 2
    GGML_TENSOR_FLAG_PARAM = 4
    GGML_TENSOR_FLAG_LOSS = 8
    GGML_TENSOR_FLAG_COMPUTE = 16

# buffer usage (ggml_backend_buffer_usage)
cdef enum:
    GGML_BACKEND_BUFFER_USAGE_ANY = 0
    GGML_BACKEND_BUFFER_USAGE_WEIGHTS = 1
    GGML_BACKEND_BUFFER_USAGE_COMPUTE = 2

# device types (ggml_backend_dev_type)
cdef enum:
    GGML_BACKEND_DEVICE_TYPE_CPU = 0
    GGML_BACKEND_DEVICE_TYPE_GPU = 1
    GGML_BACKEND_DEVICE_TYPE_IGPU = 2
    GGML_BACKEND_DEVICE_TYPE_ACCEL = 3

# answers of a backend's per-op tables (supports_op, offload_op)
cdef enum:
    GGML_PY_OP_NO = 0           # never
    GGML_PY_OP_YES = 1          # always (offload_op: when the batch is large enough)
    GGML_PY_OP_ASK = 2          # ask the backend's own method (C slot or Python)
    GGML_PY_OP_FN = 3           # ask the backend's C rule (supports_op_fn), no Python

# hash set sentinels (ggml-impl.h)
cdef enum:
    GGML_HASHSET_FULL = <size_t>-1
    GGML_HASHSET_ALREADY_EXISTS = <size_t>-2

cdef enum:
    GGML_OP_COUNT_MAX = 128     # room for ggml's op enum (96 ops in 0.10.1)

ctypedef uint32_t ggml_bitset_t

cdef struct ggml_hash_set:
    size_t size
    uint64_t size_magic         # ggml_py_mod_magic(size): slots without a division
    ggml_bitset_t * used        # [bitset_size(size)]
    ggml_tensor ** keys         # [size], valid where used

cdef struct ggml_cgraph:
    int size                    # capacity of nodes and leafs
    int n_nodes
    int n_leafs
    ggml_tensor ** nodes        # [size]
    ggml_tensor ** leafs        # [size]
    int32_t * use_counts        # [visited_hash_set.size]
    ggml_hash_set visited_hash_set

# The scheduler-facing part of a backend: everything split_graph asks of a
# backend is answerable here without calling into Python, unless a table
# entry says GGML_PY_OP_ASK.
cdef struct ggml_backend:
    char name[GGML_MAX_NAME]
    int device_type                                 # GGML_BACKEND_DEVICE_TYPE_*
    ggml_backend_buffer_type * default_buft
    uint8_t supports_op_table[GGML_OP_COUNT_MAX]    # GGML_PY_OP_*
    int (*supports_op_fn)(const ggml_backend * b, const ggml_tensor * t) noexcept nogil
    uint8_t offload_op_table[GGML_OP_COUNT_MAX]     # GGML_PY_OP_*
    int64_t offload_min_batch                       # offload_op needs batch >= this
    ggml_backend_buffer_type ** supported_bufts     # [n_supported_bufts]
    int n_supported_bufts
    bint supports_host_bufts                        # and every host buffer type (ggml's CPU)
    bint supports_buft_ask                          # unknown bufts: ask the backend
    void * pyobj                                    # the owning Backend (borrowed)
