// Compiled execution plans: for a run of graph nodes, each node's kernel, thread count
// and work-buffer share, chosen once; a snapshot of everything the choice depends on
// (for every node and each of its sources: pointer, op, type, shape, strides, data,
// buffer, op_params, sources), compared before every compute so that a stale plan is
// never run; and the loop that runs the nodes, alone or on a thread pool.

#include "cpu-impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

// What a plan depends on in one tensor. Nodes also depend on their op_params and
// sources (node_key); a source's own sources do not matter to the node.
typedef struct tensor_key {
    const gp_tensor * t;
    char *            data;
    gp_buffer *       buffer;
    int32_t           op;
    int32_t           type;
    int64_t           ne[GP_MAX_DIMS];
    size_t            nb[GP_MAX_DIMS];
} tensor_key;

typedef struct node_key {
    tensor_key  self;
    int32_t     op_params[GP_MAX_OP_PARAMS];
    gp_tensor * src[GP_MAX_SRC];
    int         first_src;                      // its sources' keys in src_keys
    int         n_src;
} node_key;

struct gp_plan {
    int            n_nodes;
    int            n_threads;
    gp_plan_node * nodes;           // [n_nodes]
    char **        errors;          // [n_nodes]: why a GP_NODE_ERROR node cannot run

    node_key *     keys;            // [n_nodes]
    tensor_key *   src_keys;        // [n_src_keys]
    int            n_src_keys;

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

void gp_tensor_layout(size_t offsets[GP_TENSOR_N_FIELDS], size_t * size) {
    size_t o[GP_TENSOR_N_FIELDS] = {
        offsetof(gp_tensor, op), offsetof(gp_tensor, flags), offsetof(gp_tensor, src),
        offsetof(gp_tensor, view_src), offsetof(gp_tensor, buffer), offsetof(gp_tensor, data),
        offsetof(gp_tensor, view_offs), offsetof(gp_tensor, type), offsetof(gp_tensor, id),
        offsetof(gp_tensor, ne), offsetof(gp_tensor, nb), offsetof(gp_tensor, op_params),
        offsetof(gp_tensor, extra), offsetof(gp_tensor, owner), offsetof(gp_tensor, name),
        offsetof(gp_tensor, gen),
    };
    memcpy(offsets, o, sizeof(o));
    *size = sizeof(gp_tensor);
}

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

gp_plan * gp_plan_new(gp_tensor * const * nodes, int n_nodes, int n_threads) {
    gp_plan * plan = calloc(1, sizeof(gp_plan));
    if (!plan) return NULL;
    plan->n_nodes = n_nodes;
    plan->n_threads = n_threads < 1 ? 1 : n_threads;
    plan->nodes = calloc((size_t)GP_MAX(n_nodes, 1), sizeof(gp_plan_node));
    plan->errors = calloc((size_t)GP_MAX(n_nodes, 1), sizeof(char *));
    plan->keys = calloc((size_t)GP_MAX(n_nodes, 1), sizeof(node_key));
    plan->rope = gp_rope_cache_new();
    atomic_init(&plan->failed, 0);
    if (!plan->nodes || !plan->errors || !plan->keys || !plan->rope) {
        gp_plan_free(plan);
        return NULL;
    }
    for (int i = 0; i < n_nodes; i++) {
        gp_tensor * t = nodes[i];
        gp_plan_node * pn = &plan->nodes[i];
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
        pn->fn = gp_select_kernel(t, plan->n_threads, &pn->n_tasks, &pn->wsize, &error);
        if (pn->fn) {
            pn->kind = GP_NODE_C;
        } else if (error) {
            gp_plan_set_error(plan, i, error);
        } else {
            pn->kind = GP_NODE_PYTHON;
        }
    }
    return plan;
}

void gp_plan_free(gp_plan * plan) {
    if (!plan) return;
    if (plan->errors) {
        for (int i = 0; i < plan->n_nodes; i++) free(plan->errors[i]);
    }
    free(plan->errors);
    free(plan->nodes);
    free(plan->keys);
    free(plan->src_keys);
    free(plan->wdata);
    free(plan->n_shared);
    free(plan->node_ns);
    gp_rope_cache_free(plan->rope);
    free(plan);
}

gp_plan_node * gp_plan_node_at(gp_plan * plan, int i) { return &plan->nodes[i]; }
int gp_plan_n_nodes(const gp_plan * plan) { return plan->n_nodes; }
size_t gp_plan_work_size(const gp_plan * plan) { return plan->wsize; }
gp_rope_cache * gp_plan_rope_cache(gp_plan * plan) { return plan->rope; }

const char * gp_plan_node_error(const gp_plan * plan, int i) {
    return plan->errors[i] ? plan->errors[i] : "";
}

void gp_plan_set_error(gp_plan * plan, int i, const char * message) {
    gp_plan_node * pn = &plan->nodes[i];
    pn->kind = GP_NODE_ERROR;
    pn->fn = NULL;
    free(plan->errors[i]);
    if (!message) message = "";
    plan->errors[i] = malloc(strlen(message) + 1);
    if (plan->errors[i]) memcpy(plan->errors[i], message, strlen(message) + 1);
}

static void fill_key(tensor_key * k, const gp_tensor * t) {
    memset(k, 0, sizeof(*k));       // (no padding bytes left undefined for memcmp)
    k->t = t;
    k->data = t->data;
    k->buffer = t->buffer;
    k->op = t->op;
    k->type = t->type;
    memcpy(k->ne, t->ne, sizeof(k->ne));
    memcpy(k->nb, t->nb, sizeof(k->nb));
}

static void fill_node_key(node_key * k, const gp_tensor * t) {
    fill_key(&k->self, t);
    memcpy(k->op_params, t->op_params, sizeof(k->op_params));
    memcpy(k->src, t->src, sizeof(k->src));
}

int gp_plan_profile(gp_plan * plan, int on) {
    if (!on) {
        free(plan->node_ns);
        plan->node_ns = NULL;
        return 0;
    }
    if (!plan->node_ns) plan->node_ns = calloc((size_t)GP_MAX(plan->n_nodes, 1), sizeof(int64_t));
    return plan->node_ns ? 0 : -1;
}

const int64_t * gp_plan_node_ns(const gp_plan * plan) { return plan->node_ns; }

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int gp_plan_finish(gp_plan * plan) {
    // the snapshot
    int n_src = 0;
    for (int i = 0; i < plan->n_nodes; i++) {
        const gp_tensor * t = plan->nodes[i].t;
        for (int s = 0; s < GP_MAX_SRC; s++) n_src += t->src[s] != NULL;
    }
    plan->src_keys = calloc((size_t)GP_MAX(n_src, 1), sizeof(tensor_key));
    if (!plan->src_keys) return -1;
    plan->n_src_keys = n_src;
    n_src = 0;
    for (int i = 0; i < plan->n_nodes; i++) {
        const gp_tensor * t = plan->nodes[i].t;
        node_key * k = &plan->keys[i];
        fill_node_key(k, t);
        k->first_src = n_src;
        for (int s = 0; s < GP_MAX_SRC; s++) {
            if (t->src[s]) fill_key(&plan->src_keys[n_src++], t->src[s]);
        }
        k->n_src = n_src - k->first_src;
    }
    // where the shared nodes are: a run without any needs no other thread
    plan->n_shared = calloc((size_t)plan->n_nodes + 1, sizeof(int));
    if (!plan->n_shared) return -1;
    for (int i = 0; i < plan->n_nodes; i++) {
        const gp_plan_node * pn = &plan->nodes[i];
        plan->n_shared[i + 1] = plan->n_shared[i] + (pn->kind == GP_NODE_C && pn->n_tasks > 1);
    }
    // the work buffer: the largest node's need
    size_t wsize = 0;
    for (int i = 0; i < plan->n_nodes; i++) {
        if (plan->nodes[i].kind == GP_NODE_C) wsize = GP_MAX(wsize, plan->nodes[i].wsize);
    }
    if (wsize) {
        wsize = gp_pad(wsize);
        plan->wdata = aligned_alloc(GP_CACHE_LINE, wsize);
        if (!plan->wdata) return -1;
    }
    plan->wsize = wsize;
    return 0;
}

int gp_plan_matches(const gp_plan * plan, gp_tensor * const * nodes, int n_nodes, int n_threads) {
    if (n_nodes != plan->n_nodes || n_threads != plan->n_threads) return 0;
    node_key nk;
    tensor_key sk;
    for (int i = 0; i < n_nodes; i++) {
        const gp_tensor * t = nodes[i];
        const node_key * k = &plan->keys[i];
        if (t != k->self.t) return 0;
        fill_node_key(&nk, t);
        nk.first_src = k->first_src;
        nk.n_src = k->n_src;
        if (memcmp(&nk, k, sizeof(nk)) != 0) return 0;
        const tensor_key * ks = plan->src_keys + k->first_src;
        for (int s = 0, j = 0; s < GP_MAX_SRC; s++) {
            if (!t->src[s]) continue;
            fill_key(&sk, t->src[s]);
            if (memcmp(&sk, &ks[j++], sizeof(sk)) != 0) return 0;
        }
    }
    return 1;
}

// ---------------------------------------------------------------------------
// running

int gp_fail(const gp_params * p, const char * fmt, ...) {
    gp_plan * plan = p->plan;
    int expected = 0;
    if (atomic_compare_exchange_strong(&plan->failed, &expected, 1)) {
        va_list ap;
        va_start(ap, fmt);
        plan->failed_node = p->node;
        vsnprintf(plan->failure, sizeof(plan->failure), fmt, ap);
        va_end(ap);
    }
    return -1;
}

void gp_plan_run_thread(gp_plan * plan, int i0, int i1, int ith, gp_threadpool * tp) {
    const int nth = tp ? gp_threadpool_n_threads(tp) : 1;
    gp_params p = {
        .ith = ith, .nth = 1, .wdata = plan->wdata, .wsize = plan->wsize, .tp = tp,
        .plan = plan, .node = 0,
    };
    int prev = -1;          // was the previous node shared between threads? (-1: none yet)
    for (int i = i0; i < i1; i++) {
        const gp_plan_node * pn = &plan->nodes[i];
        if (pn->kind != GP_NODE_C) continue;
        const int shared = nth > 1 && pn->n_tasks > 1;
        // one thread's nodes follow each other without barriers; a shared node waits
        // for everything before it and is waited for by everything after it
        if (nth > 1 && prev != -1 && (prev || shared)) gp_threadpool_barrier(tp);
        prev = shared;
        if (atomic_load(&plan->failed)) continue;       // (the barriers are still kept)
        if (!shared && ith != 0) continue;
        p.ith = shared ? ith : 0;
        p.nth = shared ? nth : 1;
        p.node = i;
        const int64_t t0 = plan->node_ns && ith == 0 ? now_ns() : 0;
        if (pn->fn(&p, pn->t) != 0 && !atomic_load(&plan->failed)) {
            gp_fail(&p, "kernel failed");
        }
        if (t0) plan->node_ns[i] += now_ns() - t0;
    }
    if (nth > 1) gp_threadpool_barrier(tp);
}

int gp_plan_run(gp_plan * plan, int i0, int i1, gp_threadpool * tp) {
    atomic_store(&plan->failed, 0);
    plan->failure[0] = 0;
    if (tp && (gp_threadpool_n_threads(tp) != plan->n_threads || !gp_threadpool_alive(tp))) tp = NULL;
    if (plan->n_shared[i1] == plan->n_shared[i0]) tp = NULL;      // nothing to share: no wake-ups
    if (tp) {
        gp_threadpool_run(tp, plan, i0, i1);
    } else {
        gp_plan_run_thread(plan, i0, i1, 0, NULL);
    }
    return atomic_load(&plan->failed) ? -1 : 0;
}

const char * gp_plan_failure(const gp_plan * plan, int * node) {
    if (node) *node = plan->failed_node;
    return plan->failure;
}
