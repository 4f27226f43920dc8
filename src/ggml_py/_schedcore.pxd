# SchedCore: the state of ggml_backend_sched (ggml-backend.cpp), in groups of structs
# held by value (_schedtypes.pxd, and graph reuse's fingerprint in _reuse.pxd), and its
# Python face (_schedcore.pyx). The passes that fill it are in _sched.pyx.

from libc.stdint cimport int8_t, uint8_t, uint64_t
from ggml_py._ggml cimport *
from ggml_py._core cimport Context
from ggml_py._alloc cimport GraphAllocator
from ggml_py._schedtypes cimport (sched_options, sched_sweep, sched_graph_copy, sched_pipeline,
                                  sched_split, sched_tensor_info, sched_rewiring)
from ggml_py._reuse cimport sched_fingerprint

cdef class SchedCore:
    # backends, in priority order (the last one is the CPU)
    cdef readonly int n_backends
    cdef ggml_backend ** backends               # [n_backends]
    cdef ggml_backend_buffer_type ** bufts      # [n_backends]
    cdef list _keep                             # the Python backends and buffer types
    cdef sched_options opts

    # hash map of the nodes in the graph
    cdef ggml_hash_set hash_set
    cdef int8_t * hv_tensor_backend_ids         # [hash_set.size]; -1: none (at most 64
                                                # backends: a byte keeps the slots the
                                                # split writes 4x denser than ggml's int)
    cdef uint8_t * hv_tensor_causes             # [hash_set.size]
    cdef ggml_tensor ** hv_tensor_copies        # [hash_set.size][n_backends][n_copies]

    cdef sched_sweep sweep                      # pass 1's arrays, read by passes 2 to 5
    cdef sched_graph_copy graph_copy            # what is allocated and run

    # graph splits
    cdef sched_split * splits                   # [splits_capacity]
    cdef readonly int n_splits
    cdef int splits_capacity

    cdef sched_pipeline pipeline                # copy slots (pipeline parallelism)

    # the scheduler's own tensors (copies, dependency views) and what each is
    cdef readonly Context arena                 # reset on every split
    cdef sched_tensor_info * infos              # [infos_capacity], by arena index
    cdef int infos_capacity

    # the compute buffers: one graph allocator over the backends' buffer types
    cdef readonly GraphAllocator galloc
    cdef readonly int n_reallocs                # reserves made by alloc_graph
    cdef readonly int n_unexpected_reallocs     # ... of them with an unchanged graph

    # the last split was not allocated: the allocator's plan is of an older split, whose
    # backend ids alloc_graph cannot compare with
    cdef bint split_pending
    cdef bint plan_stale

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

    # graph reuse, level 2 (_reuse.pyx): the fingerprint of the plan's graph
    cdef readonly int n_graph_rebuilt_reuses    # reuses of it for a rebuilt, equal graph
    cdef sched_fingerprint fp
    cdef list fp_keep                           # the tensors outside the graph (handles)
    cdef list fp_assignments                    # [(ref, backend id)] of plan_assignments
