# The scheduler's records and the groups of SchedCore's state (structs only: no module
# of its own). SchedCore (_schedcore.pxd) holds each group by value, as ggml_cgraph holds
# its ggml_hash_set; the passes (_sched.pyx), graph reuse (_reuse.pyx) and the allocation
# glue (_schedalloc.pyx) read them through it.

from libc.stdint cimport int8_t, uint8_t, uint16_t, int32_t, uint32_t, int64_t, uint64_t
from ggml_py._ggml cimport *

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

# what pass 1 records of a node of the graph being split (SchedCore.sweep.node_bits)
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
    int fp_entry            # its index in fp.entries (graph reuse, level 2)

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


# fixed when the scheduler is made (ggml: compile-time constants and sched_new's flags)
cdef struct sched_options:
    int graph_size
    int max_split_inputs
    int max_graph_inputs
    int debug_realloc                   # GGML_SCHED_DEBUG_REALLOC level
    bint realloc_raises                 # raise instead of warning
    bint copy_all_inputs                # pass 6: every input leaf gets copies
    bint op_offload

# the graph being split as passes 2 to 5 read it, built in one sweep by pass 1 so
# that they walk compact arrays instead of the tensor structs: each node's hash slot
# and NODE_* bits, and its sources, node i's being srcs[src_begin[i]:src_begin[i + 1]]
cdef struct sched_sweep:
    uint32_t * node_slots               # [pre_capacity]: by index in dense_ids
                                        # (a node's position, n_nodes + a leaf's;
                                        # a slot fits: graph_size <= INT32_MAX)
    outside_source * outside            # [outside_capacity]: sources outside the
    int n_outside, outside_capacity     # graph (split_src.ref < 0)
    uint8_t * node_bits                 # [node_slots_capacity]
    int * view_refs                     # [node_slots_capacity]: a view's view_src's
                                        # index in dense_ids, where pass 1 found it
                                        # (-1: not yet hashed; set for NODE_VIEW only)
    # what a node reading a tensor of the graph records of it, by the tensor's index in
    # dense_ids, from the tensor's own sweep (a weight's buffer struct, read there, is
    # out of the caches by the node that reads it, in a large graph): the buffer type of
    # its memory (set only with SRC_MEMORY) and its SRC_* bits but SRC_NOT_BEFORE
    ggml_backend_buffer_type ** dense_bufts     # [pre_capacity]
    uint8_t * dense_bits                # [pre_capacity]
    int * leaf_refs                     # [pre_capacity]: each leaf's index in
                                        # dense_ids (its node position, if a node)
    int * compute_nodes                 # [node_slots_capacity]: the positions of the
    int * compute_refs                  # nodes that are not view ops (passes 2 and 3
    uint32_t * compute_slots            # walk them), their indexes in dense_ids,
    uint16_t * compute_ops              # their hash slots and ops
    int n_compute
    # The backend ids of the graph's nodes and leafs in graph order, [nodes, leafs]: what
    # passes 2 to 5 read instead of hv_tensor_backend_ids, whose slots lie scattered over
    # an array too large for the caches in a large graph. Every write goes to both
    # (set_backend). A node's index is its position (its last, in a graph that lists it
    # twice: node_refs), a leaf's n_nodes + its position (unless it is a node too).
    int8_t * dense_ids                  # [pre_capacity] (a byte, as hv_tensor_backend_ids)
    int * node_refs                     # [node_slots_capacity], and compute_refs: made
    bint refs_are_positions             # only by an exact sweep; else every node's
                                        # index is its position (node_refs_of,
                                        # compute_refs_of)
    int node_slots_capacity
    int * src_begin                     # [node_slots_capacity + 1]
    split_src * srcs                    # [src_capacity]
    int src_capacity
    # the memory of each leaf, then node, as pass 1 saw it (before the allocation): pass 1
    # lists the tensors that have any (most nodes have none, and a split of 100k nodes
    # wrote 2 MB of zeros), by index (a leaf's position, n_leafs + a node's); graph reuse
    # (fp_build) reads their memory, which the allocation left as it was (it places only
    # tensors without), into the two dense arrays
    int * pre_indexes                   # [pre_capacity]
    int n_pre_indexes
    ggml_backend_buffer ** pre_memory   # [pre_capacity]
    size_t * pre_offset                 # [pre_capacity]
    int pre_capacity

# the graph copy: the graph with the inputs of each split added, which is allocated
# and run, and the backend of each of its nodes and leafs (and the previous split's)
cdef struct sched_graph_copy:
    ggml_cgraph graph
    int graph_capacity
    int * node_backend_ids              # [ids_capacity]
    int * leaf_backend_ids              # [ids_capacity]
    int * prev_node_backend_ids         # [ids_capacity]
    int * prev_leaf_backend_ids         # [ids_capacity]
    int ids_capacity
    int debug_graph_size                # its size, and the previous split's (ggml's
    int debug_prev_graph_size           # unexpected-reallocation check)

# pipeline parallelism: n_copies slots of every input copy
cdef struct sched_pipeline:
    int n_copies
    int cur_copy
    int next_copy
    graph_input * graph_inputs          # [max_graph_inputs]
    int n_graph_inputs
    # a kept plan moves to the next copy slot (rotate_copy_slot), in place where every
    # graph input is memory of the compute buffers: the graph copy's tensors that view
    # a graph input follow it to its new memory
    bint rotates_in_place
    ggml_tensor ** input_views          # [input_views_cap]
    int n_input_views, input_views_cap
