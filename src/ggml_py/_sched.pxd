# Scheduler core: port of ggml_backend_sched's state and split (ggml-backend.cpp).
# See _sched.pyx for details.

from libc.stdint cimport int8_t, uint8_t, uint16_t, int32_t, uint32_t, int64_t, uint64_t
from ggml_py._ggml cimport *
from ggml_py._core cimport Context, Graph
from ggml_py._alloc cimport GraphAllocator, recorded_place

# why a tensor got its backend (ggml's SET_CAUSE, kept on the object here)
cdef enum:
    CAUSE_NONE = 0
    CAUSE_USR
    CAUSE_USR_AWAY      # a view the user assigned away from the memory it views
    CAUSE_1_DST
    CAUSE_1_VSRC
    CAUSE_1_INP
    CAUSE_1_OFF
    CAUSE_2_SUP
    CAUSE_3_BEST
    CAUSE_3_UPG
    CAUSE_4_VSRC
    CAUSE_4_CUR
    CAUSE_1_WGT0        # 1.wgtN is CAUSE_1_WGT0 + N

# what a tensor of the scheduler's own arena is
cdef enum:
    SCHED_TENSOR_COPY = 0   # copy of an input on another backend, one per copy slot
    SCHED_TENSOR_DEP = 1    # view added so that an input outlives its copy

# what pass 1 records of a node of the graph being split (SchedCore.node_bits)
cdef enum:
    NODE_VIEW_OP = 1        # a view op (passes 2, 3 and 5 skip it)
    NODE_INPUT = 2          # flagged INPUT
    NODE_VIEW = 4           # has a view_src
    NODE_BASE_LATER = 8     # computes into a view_src the graph computes at its position or later
    NODE_WEIGHTS = 16       # reads a source in a weights buffer
    NODE_USER = 32          # a view op the user assigned (passes 2 to 4 leave its backend)

# ... and of each of its sources
cdef enum:
    SRC_WEIGHTS = 1         # in a weights buffer
    SRC_INPUT = 2           # flagged INPUT
    SRC_VIEW = 4            # has a view_src
    SRC_NOT_BEFORE = 8      # a node of the graph at the reading node's position or later
    SRC_HOST = 16           # in a weights buffer of a host buffer type (pass 1's offload rule)
    SRC_MEMORY = 32         # has memory (its buft is kept: dense_bufts, outside_source.buft)

cdef struct split_src:
    # 8 bytes: a large graph's srcs outgrow the caches, and pass 1 writes one per source.
    # What the passes read of the source tensor itself is kept once per tensor, by its
    # ref (dense_bufts, dense_bits; src_tensor finds the tensor in the graph's lists)
    int ref                             # its index in dense_ids; for a tensor that is
                                        # neither node nor leaf, -2 - its index in
                                        # outside (src_slot finds its hash slot)
    uint8_t j                           # the node's source slot it is in
    uint8_t bits                        # SRC_*

# a source that is neither node nor leaf of the graph being split (split_src.ref < 0)
cdef struct outside_source:
    ggml_tensor * tensor
    ggml_backend_buffer_type * buft     # the buffer type of its memory; NULL: none
    Py_ssize_t slot                     # its hash slot

# the first source of a tensor in a weights buffer: the rule that runs an op where its
# weights are (backend_id_from_cur) reads it
cdef struct weights_source:
    int j                               # its source slot; -1: the tensor reads no weights
    bint host                           # of a host buffer type (SRC_HOST)
    ggml_backend_buffer_type * buft

cdef struct sched_split:
    int backend_id
    int i_start
    int i_end
    ggml_tensor ** inputs   # [max_split_inputs]
    int n_inputs

# an input of the graph, in parallel mode: each copy slot has a copy of it, the current
# slot's being the input itself
cdef struct graph_input:
    ggml_tensor * tensor
    Py_ssize_t slot         # its hash slot
    int backend_id          # where it and its copies live
    int32_t flags           # its flags before the split marked it input and output
    int fp_entry            # its index in fp_entries (graph reuse, level 2)

cdef struct sched_tensor_info:
    int kind                # SCHED_TENSOR_*
    ggml_tensor * of        # the tensor it copies or depends on
    int backend_id          # copies: where the copy lives
    int copy_id             # copies: the copy slot

# a node source pass 5 replaced by a copy (undone before the arena is reused)
cdef struct sched_rewiring:
    ggml_tensor ** slot     # &node.src[j]
    ggml_tensor * original
    ggml_tensor * copy      # what pass 5 put there
    int node                # i and j of the slot (graph reuse, level 2)
    int src

# graph reuse, level 2: a tensor of the planned graph as the plan depends on it. Tensors
# are named by reference: an index in the table of the compared graph's tensors
# [NULL, nodes, leafs, tensors outside the graph] (0: none)
cdef enum:
    FP_LAYOUT_WORDS = 16    # ne, nb and op_params: 128 bytes side by side in ggml_tensor
    FP_TENSOR_BYTES = 128   # what the compare reads of a tensor with a layout id

cdef struct fp_tensor:             # 64 bytes: one cache line
    uint64_t head                   # op and flags (the tensor's first 8 bytes)
    uint32_t src[GGML_PY_FIRST_SOURCES]
    uint32_t more_src               # 0: the other source slots are NULL; else 1 + its row
                                    # of fp_more_srcs (few tensors have more sources)
    uint32_t view_src
    uint32_t layout                 # index in fp_layouts
    int32_t layout_id               # the tensor's (t.layout; 0: none, compare fp_layouts')
    ggml_backend_buffer * buffer    # memory before the allocation, as buffer and data
    char * data                     # hold it: none (NULL, NULL), an address (NULL, data)
    size_t view_offs                # or in a buffer; and a view's offset

cdef enum:
    FP_MORE_SOURCES = GGML_MAX_SRC - GGML_PY_FIRST_SOURCES     # a row of fp_more_srcs

# type, ne, nb and op_params of a tensor: the few distinct ones of a graph, shared
cdef struct fp_layout:
    int type
    uint64_t words[FP_LAYOUT_WORDS]

# a key of the hash set, by reference
cdef struct fp_entry:
    Py_ssize_t slot
    uint32_t ref

cdef class SchedCore:
    # backends, in priority order (the last one is the CPU)
    cdef readonly int n_backends
    cdef ggml_backend ** backends               # [n_backends]
    cdef ggml_backend_buffer_type ** bufts      # [n_backends]
    cdef list _keep                             # the Python backends and buffer types

    # limits (ggml: compile-time constants)
    cdef int max_split_inputs
    cdef int max_graph_inputs
    cdef readonly int graph_size

    # hash map of the nodes in the graph
    cdef ggml_hash_set hash_set
    cdef int8_t * hv_tensor_backend_ids         # [hash_set.size]; -1: none (at most 64
                                                # backends: a byte keeps the slots the
                                                # split writes 4x denser than ggml's int)
    cdef uint8_t * hv_tensor_causes             # [hash_set.size]
    cdef ggml_tensor ** hv_tensor_copies        # [hash_set.size][n_backends][n_copies]

    # the graph being split as passes 2 to 5 read it, built in one sweep by pass 1 so
    # that they walk compact arrays instead of the tensor structs: each node's hash slot
    # and NODE_* bits, and its sources, node i's being srcs[src_begin[i]:src_begin[i + 1]]
    cdef uint32_t * node_slots                  # [pre_capacity]: by index in dense_ids
                                                # (a node's position, n_nodes + a leaf's;
                                                # a slot fits: graph_size <= INT32_MAX)
    cdef outside_source * outside               # [outside_capacity]: sources outside the
    cdef int n_outside, outside_capacity        # graph (split_src.ref < 0)
    cdef uint8_t * node_bits                    # [node_slots_capacity]
    cdef int * view_refs                        # [node_slots_capacity]: a view's view_src's
                                                # index in dense_ids, where pass 1 found it
                                                # (-1: not yet hashed; set for NODE_VIEW only)
    # what a node reading a tensor of the graph records of it, by the tensor's index in
    # dense_ids, from the tensor's own sweep (a weight's buffer struct, read there, is
    # out of the caches by the node that reads it, in a large graph): the buffer type of
    # its memory (set only with SRC_MEMORY) and its SRC_* bits but SRC_NOT_BEFORE
    cdef ggml_backend_buffer_type ** dense_bufts    # [pre_capacity]
    cdef uint8_t * dense_bits                   # [pre_capacity]
    cdef int * leaf_refs                        # [pre_capacity]: each leaf's index in
                                                # dense_ids (its node position, if a node)
    cdef int * compute_nodes                    # [node_slots_capacity]: the positions of the
    cdef int * compute_refs                     # nodes that are not view ops (passes 2 and 3
    cdef uint32_t * compute_slots               # walk them), their indexes in dense_ids,
    cdef uint16_t * compute_ops                 # their hash slots and ops
    cdef int n_compute
    # The backend ids of the graph's nodes and leafs in graph order, [nodes, leafs]: what
    # passes 2 to 5 read instead of hv_tensor_backend_ids, whose slots lie scattered over
    # an array too large for the caches in a large graph. Every write goes to both
    # (set_backend). A node's index is its position (its last, in a graph that lists it
    # twice: node_refs), a leaf's n_nodes + its position (unless it is a node too).
    cdef int8_t * dense_ids                     # [pre_capacity] (a byte, as hv_tensor_backend_ids)
    cdef int * node_refs                        # [node_slots_capacity], and compute_refs: made
    cdef bint refs_are_positions                # only by an exact sweep; else every node's
                                                # index is its position (node_refs_of,
                                                # compute_refs_of)
    cdef int node_slots_capacity
    cdef int * src_begin                        # [node_slots_capacity + 1]
    cdef split_src * srcs                       # [src_capacity]
    cdef int src_capacity

    # backend of each graph-copy node / leaf, and of the previous split's
    cdef int * node_backend_ids                 # [ids_capacity]
    cdef int * leaf_backend_ids                 # [ids_capacity]
    cdef int * prev_node_backend_ids            # [ids_capacity]
    cdef int * prev_leaf_backend_ids            # [ids_capacity]
    cdef int ids_capacity

    # copy of the graph with the inputs of each split added
    cdef ggml_cgraph graph
    cdef int graph_capacity
    cdef int debug_graph_size
    cdef int debug_prev_graph_size

    # graph splits
    cdef sched_split * splits                   # [splits_capacity]
    cdef readonly int n_splits
    cdef int splits_capacity

    # pipeline parallelism
    cdef readonly int n_copies
    cdef readonly int cur_copy
    cdef int next_copy
    cdef graph_input * graph_inputs             # [max_graph_inputs]
    cdef int n_graph_inputs
    # a kept plan moves to the next copy slot (rotate_copy_slot), in place where every
    # graph input is memory of the compute buffers: the graph copy's tensors that view
    # a graph input follow it to its new memory
    cdef bint rotates_in_place
    cdef ggml_tensor ** input_views             # [input_views_cap]
    cdef int n_input_views, input_views_cap

    # the scheduler's own tensors (copies, dependency views) and what each is
    cdef readonly Context arena                          # reset on every split
    cdef sched_tensor_info * infos              # [infos_capacity], by arena index
    cdef int infos_capacity

    # the compute buffers: one graph allocator over the backends' buffer types
    cdef readonly GraphAllocator galloc
    cdef readonly int debug_realloc             # GGML_SCHED_DEBUG_REALLOC level
    cdef readonly bint realloc_raises           # raise instead of warning
    cdef readonly bint copy_all_inputs          # pass 6: every input leaf gets copies
    cdef readonly int n_reallocs                # reserves made by alloc_graph
    cdef readonly int n_unexpected_reallocs     # ... of them with an unchanged graph

    # the last split was not allocated: the allocator's plan is of an older split, whose
    # backend ids alloc_graph cannot compare with
    cdef bint split_pending
    cdef bint plan_stale

    cdef bint op_offload
    cdef readonly bint is_reset
    cdef readonly bint is_alloc

    # the graph last split, for introspection
    cdef ggml_cgraph * last_graph
    # ... and the Graph holding it: its tensors stay alive while they point at the
    # arena's copies (rewired) or into the compute buffers (placed)
    cdef object last_graph_obj
    cdef sched_rewiring * rewired               # [n_rewired]
    cdef int n_rewired
    cdef int rewired_cap

    # graph reuse: the plan and the allocation of last_graph_obj are kept across a
    # reset, and alloc_graph / split_graph of the same graph take them again as long
    # as nothing they depend on changed (the mutation epochs of _core) and the user
    # assignments made since the reset are the plan's
    cdef public bint graph_reuse                # on by default (Scheduler(graph_reuse=))
    cdef readonly int n_graph_reuses            # splits and allocations skipped
    cdef bint plan_reusable                     # the tables, splits, graph copy and
                                                # placements are last_graph_obj's, made
                                                # from a reset state
    cdef bint reset_deferred                    # reset() kept the tables for a reuse
    cdef bint tables_fresh                      # no split wrote the tables since they
                                                # were cleared (only user assignments)
    cdef uint64_t plan_epoch                    # the mutation epoch the plan is current at
    cdef dict user_assignments                  # {address: (Tensor, backend id)} since the
                                                # last reset
    cdef dict plan_assignments                  # ... in force when the plan was made
    cdef readonly list away_views               # (position, backend id) of each view the
                                                # user assigned away from its memory (pass 5)

    # graph reuse, level 2: the fingerprint of the plan's graph (made at the first
    # alloc_graph of another graph) and what re-points the plan at an equal graph
    cdef readonly int n_graph_rebuilt_reuses    # ... of them for a rebuilt, equal graph
    cdef uint8_t fp_state                       # FP_NONE / FP_BUILDABLE / FP_BUILT
    cdef uint64_t fp_epoch                      # the fingerprint is true at this epoch
    cdef fp_tensor * fp_tensors                 # [fp_n_nodes + fp_n_leafs]: nodes, leafs
    cdef uint32_t * fp_more_srcs                # [fp_n_more][FP_MORE_SOURCES]: the later
    cdef int fp_n_more                          # source slots of the few that use them
    cdef int fp_n_nodes
    cdef int fp_n_leafs
    cdef fp_layout * fp_layouts                 # [fp_n_layouts]
    cdef int fp_n_layouts
    cdef ggml_backend_buffer ** fp_buffers      # [fp_n_buffers]: of the pre-allocated ones
    cdef int fp_n_buffers
    # the reference tables: of the graph compared last, and of the one re-pointed to last
    cdef ggml_tensor ** fp_table                # [1 + fp_n_nodes + fp_n_leafs + fp_n_outside]
    cdef ggml_tensor ** fp_cur_table            # (the hash set's keys, when re-keyed)
    cdef fp_entry * fp_entries                  # [fp_n_entries]: every key of the hash set
    cdef int fp_n_entries
    cdef int * fp_tmp_ids                       # [fp_n_entries]: their values while the
    cdef uint8_t * fp_tmp_causes                # set is re-made
    cdef ggml_tensor ** fp_tmp_copies           # [fp_n_entries][n_backends][n_copies]
    cdef uint32_t * fp_inputs                   # [fp_n_inputs]: the splits' inputs
    cdef char * fp_input_names                  # [fp_n_inputs][GGML_MAX_NAME]: copies are
    cdef int fp_n_inputs                        # named after them
    cdef uint32_t * fp_arena_of                 # [fp_n_arena]: what each arena tensor is of
    cdef int fp_n_arena
    cdef sched_rewiring * fp_rewirings          # [fp_n_rewirings]: node, src and copy
    cdef int fp_n_rewirings
    cdef ggml_tensor ** fp_outside              # [fp_n_outside]: tensors outside the graph
    cdef int fp_n_outside
    cdef list fp_keep                           # ... kept alive (their handles)
    cdef list fp_assignments                    # [(ref, backend id)] of plan_assignments
    cdef int * fp_input_entries                 # [fp_n_inputs]: each input's fp_entries index
    # the allocation, replayed for an equal graph: where it left the graph copy's leafs
    # and nodes (-1: not replayable), and the allocator's chunks it points into
    cdef recorded_place * fp_places             # [fp_n_places]
    cdef int fp_n_places
    cdef ggml_backend_buffer ** fp_chunks       # [galloc.n_buffers * GGML_VBUFFER_MAX_CHUNKS]
    # the hash set is re-keyed when read (fp_ensure_keys), not at each re-pointing: while
    # keys_stale, its keys are an earlier graph's, fp_entries say where each entry is,
    # and fp_cur_table names the tensors of the graph re-pointed to last
    cdef bint keys_stale
    # the memory of each leaf, then node, as pass 1 saw it (before the allocation): pass 1
    # lists the tensors that have any (most nodes have none, and a split of 100k nodes
    # wrote 2 MB of zeros), by index (a leaf's position, n_leafs + a node's); fp_build
    # reads their memory, which the allocation left as it was (it places only tensors
    # without), into the two dense arrays
    cdef int * pre_indexes                      # [pre_capacity]
    cdef int n_pre_indexes
    cdef ggml_backend_buffer ** pre_memory      # [pre_capacity]
    cdef size_t * pre_offset                    # [pre_capacity]
    cdef int pre_capacity

cdef int sched_reset(SchedCore s) except -1
cdef int forget_plan(SchedCore s) except -1
cdef bint try_reuse(SchedCore s, Graph g) except -1
cdef bint try_reuse_rebuilt(SchedCore s, Graph g) except -1
cdef int sched_split_graph(SchedCore s, Graph graph) except -1
cdef int sched_tensor_backend_id(SchedCore s, ggml_tensor * t) noexcept
cdef int sched_alloc_splits(SchedCore s) except -1
cdef int sched_alloc_graph(SchedCore s, Graph graph) except -1
