// cplans: the CPU executor's compiled execution plans (not the scheduler's split plan). For
// a run of graph nodes: each node's kernel, thread count and work-buffer share, chosen once
// (whether it is still current is the mutation epochs' answer: the executor,
// ggml_py.backends.cpu._executor, asks them before every compute); and the loop that runs
// the nodes, alone or on a thread pool.

#include "cpu-impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

struct gp_cplan {
    int            n_nodes;
    int            n_threads;
    gp_cplan_node * nodes;          // [n_nodes]
    char **        errors;          // [n_nodes]: why a GP_NODE_ERROR node cannot run

    int *          n_shared;        // [n_nodes + 1]: shared C nodes before node i

    char *         wdata;           // work buffer, cache-line aligned
    size_t         wsize;
    gp_rope_cache * rope;

    int64_t *      node_ns;         // [n_nodes]: time spent per node, when profiling

    // the last run's failure: the first kernel to fail records it
    atomic_int     failed;
    int            failed_node;
    char           failure[256];
};

int gp_tensor_extent(const gp_tensor * t, size_t * lo, size_t * hi) {
    const int64_t blck = gp_blck_size(t->type);
    const size_t ts = gp_type_size(t->type);
    *lo = *hi = 0;
    if (ts == 0) return 0;
    for (int i = 0; i < GP_MAX_DIMS; i++) {
        if (t->ne[i] < 0) return 0;
        if (t->ne[i] == 0) return 1;                // no elements, no bytes
    }
    if (t->ne[0] % blck) return 0;
    size_t span = ts, term;
    for (int i = 0; i < GP_MAX_DIMS; i++) {
        const uint64_t count = (uint64_t)(i == 0 ? t->ne[0] / blck : t->ne[i]) - 1;
        if (__builtin_mul_overflow(count, (uint64_t)t->nb[i], &term) ||
            __builtin_add_overflow(span, term, &span)) return 0;
    }
    *hi = span;
    return 1;
}

// ---------------------------------------------------------------------------
// building

static int is_view_op(int op) {
    return op == GP_OP_NONE || op == GP_OP_RESHAPE || op == GP_OP_VIEW || op == GP_OP_PERMUTE ||
           op == GP_OP_TRANSPOSE;
}

gp_cplan * gp_cplan_new(gp_tensor * const * nodes, int n_nodes, int n_threads) {
    gp_cplan * cplan = calloc(1, sizeof(gp_cplan));
    if (!cplan) return NULL;
    cplan->n_nodes = n_nodes;
    cplan->n_threads = n_threads < 1 ? 1 : n_threads;
    cplan->nodes = calloc((size_t)GP_MAX(n_nodes, 1), sizeof(gp_cplan_node));
    cplan->errors = calloc((size_t)GP_MAX(n_nodes, 1), sizeof(char *));
    cplan->rope = gp_rope_cache_new();
    atomic_init(&cplan->failed, 0);
    if (!cplan->nodes || !cplan->errors || !cplan->rope) {
        gp_cplan_free(cplan);
        return NULL;
    }
    for (int i = 0; i < n_nodes; i++) {
        gp_tensor * t = nodes[i];
        gp_cplan_node * pn = &cplan->nodes[i];
        pn->t = t;
        pn->n_tasks = 1;
        if (is_view_op(t->op)) {
            pn->kind = GP_NODE_NOOP;
            continue;
        }
        if (gp_nelements(t) == 0) {         // ggml skips empty nodes too
            pn->kind = GP_NODE_NOOP;
            continue;
        }
        const char * error = NULL;
        pn->fn = gp_select_kernel(t, cplan->n_threads, &pn->n_tasks, &pn->wsize, &error);
        if (pn->fn) {
            pn->kind = GP_NODE_C;
        } else if (error) {
            gp_cplan_set_error(cplan, i, error);
        } else {
            pn->kind = GP_NODE_PYTHON;
        }
    }
    return cplan;
}

void gp_cplan_free(gp_cplan * cplan) {
    if (!cplan) return;
    if (cplan->errors) {
        for (int i = 0; i < cplan->n_nodes; i++) free(cplan->errors[i]);
    }
    free(cplan->errors);
    free(cplan->nodes);
    free(cplan->wdata);
    free(cplan->n_shared);
    free(cplan->node_ns);
    gp_rope_cache_free(cplan->rope);
    free(cplan);
}

gp_cplan_node * gp_cplan_node_at(gp_cplan * cplan, int i) { return &cplan->nodes[i]; }
int gp_cplan_n_nodes(const gp_cplan * cplan) { return cplan->n_nodes; }
size_t gp_cplan_work_size(const gp_cplan * cplan) { return cplan->wsize; }
gp_rope_cache * gp_cplan_rope_cache(gp_cplan * cplan) { return cplan->rope; }

const char * gp_cplan_node_error(const gp_cplan * cplan, int i) {
    return cplan->errors[i] ? cplan->errors[i] : "";
}

void gp_cplan_set_error(gp_cplan * cplan, int i, const char * message) {
    gp_cplan_node * pn = &cplan->nodes[i];
    pn->kind = GP_NODE_ERROR;
    pn->fn = NULL;
    free(cplan->errors[i]);
    if (!message) message = "";
    cplan->errors[i] = malloc(strlen(message) + 1);
    if (cplan->errors[i]) memcpy(cplan->errors[i], message, strlen(message) + 1);
}

int gp_cplan_profile(gp_cplan * cplan, int on) {
    if (!on) {
        free(cplan->node_ns);
        cplan->node_ns = NULL;
        return 0;
    }
    if (!cplan->node_ns)
        cplan->node_ns = calloc((size_t)GP_MAX(cplan->n_nodes, 1), sizeof(int64_t));
    return cplan->node_ns ? 0 : -1;
}

const int64_t * gp_cplan_node_ns(const gp_cplan * cplan) { return cplan->node_ns; }

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int gp_cplan_finish(gp_cplan * cplan) {
    // where the shared nodes are: a run without any needs no other thread
    cplan->n_shared = calloc((size_t)cplan->n_nodes + 1, sizeof(int));
    if (!cplan->n_shared) return -1;
    for (int i = 0; i < cplan->n_nodes; i++) {
        const gp_cplan_node * pn = &cplan->nodes[i];
        cplan->n_shared[i + 1] = cplan->n_shared[i] +
                                 (pn->kind == GP_NODE_C && pn->n_tasks > 1);
    }
    // the work buffer: the largest node's need
    size_t wsize = 0;
    for (int i = 0; i < cplan->n_nodes; i++) {
        if (cplan->nodes[i].kind == GP_NODE_C) wsize = GP_MAX(wsize, cplan->nodes[i].wsize);
    }
    if (wsize) {
        wsize = gp_pad(wsize);
        cplan->wdata = aligned_alloc(GP_CACHE_LINE, wsize);
        if (!cplan->wdata) return -1;
    }
    cplan->wsize = wsize;
    return 0;
}

// ---------------------------------------------------------------------------
// running

int gp_fail(const gp_params * p, const char * fmt, ...) {
    gp_cplan * cplan = p->cplan;
    int expected = 0;
    if (atomic_compare_exchange_strong(&cplan->failed, &expected, 1)) {
        va_list ap;
        va_start(ap, fmt);
        cplan->failed_node = p->node;
        vsnprintf(cplan->failure, sizeof(cplan->failure), fmt, ap);
        va_end(ap);
    }
    return -1;
}

void gp_cplan_run_thread(gp_cplan * cplan, int i0, int i1, int ith, gp_threadpool * tp) {
    const int nth = tp ? gp_threadpool_n_threads(tp) : 1;
    gp_params p = {
        .ith = ith, .nth = 1, .wdata = cplan->wdata, .wsize = cplan->wsize, .tp = tp,
        .cplan = cplan, .node = 0,
    };
    int prev = -1;          // was the previous node shared between threads? (-1: none yet)
    for (int i = i0; i < i1; i++) {
        const gp_cplan_node * pn = &cplan->nodes[i];
        if (pn->kind != GP_NODE_C) continue;
        const int shared = nth > 1 && pn->n_tasks > 1;
        // one thread's nodes follow each other without barriers; a shared node waits
        // for everything before it and is waited for by everything after it
        if (nth > 1 && prev != -1 && (prev || shared)) gp_threadpool_barrier(tp);
        prev = shared;
        if (atomic_load(&cplan->failed)) continue;       // (the barriers are still kept)
        if (!shared && ith != 0) continue;
        p.ith = shared ? ith : 0;
        p.nth = shared ? nth : 1;
        p.node = i;
        const int64_t t0 = cplan->node_ns && ith == 0 ? now_ns() : 0;
        if (pn->fn(&p, pn->t) != 0 && !atomic_load(&cplan->failed)) {
            gp_fail(&p, "kernel failed");
        }
        if (t0) cplan->node_ns[i] += now_ns() - t0;
    }
    if (nth > 1) gp_threadpool_barrier(tp);
}

int gp_cplan_run(gp_cplan * cplan, int i0, int i1, gp_threadpool * tp) {
    atomic_store(&cplan->failed, 0);
    cplan->failure[0] = 0;
    if (tp && (gp_threadpool_n_threads(tp) != cplan->n_threads || !gp_threadpool_alive(tp))) tp = NULL;
    if (cplan->n_shared[i1] == cplan->n_shared[i0]) tp = NULL;      // nothing to share: no wake-ups
    if (tp) {
        gp_threadpool_run(tp, cplan, i0, i1);
    } else {
        gp_cplan_run_thread(cplan, i0, i1, 0, NULL);
    }
    return atomic_load(&cplan->failed) ? -1 : 0;
}

const char * gp_cplan_failure(const gp_cplan * cplan, int * node) {
    if (node) *node = cplan->failed_node;
    return cplan->failure;
}
