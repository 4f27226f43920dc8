// A small pthread pool with ggml's shape: n_threads - 1 workers and the caller as
// thread 0 run the same cplan, meeting at a barrier after each node that is shared
// between threads (ggml_barrier). A job starts with a barrier too: idle workers wait in
// it, spinning for a short while and then sleeping on a condition variable, so a pool
// costs nothing between computes and little between nodes.

#include "cpu-impl.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>

#if defined(__x86_64__) || defined(__i386__)
#define CPU_RELAX() __builtin_ia32_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

// A waiter spins (pause) for a while, then yields its core for a while (on a busy
// machine the thread it waits for may need it), then sleeps: within a compute the next
// node comes quickly, between computes the workers sleep.
#define SPIN_ROUNDS  16384      // about 0.3 ms of pause
#define YIELD_ROUNDS 256

// A child of fork() has the pool's memory but none of its threads: its pools are dead
// (gp_threadpool_alive) and must not be waited on.
static atomic_int fork_generation;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static void on_fork_child(void) { atomic_fetch_add(&fork_generation, 1); }
static void register_atfork(void) { pthread_atfork(NULL, NULL, on_fork_child); }

struct gp_threadpool {
    int         fork_gen;               // fork_generation when the workers started
    int         n_threads;
    pthread_t * workers;                // [n_threads - 1]
    int         n_started;

    // barrier
    atomic_int      n_arrived;
    atomic_int      generation;
    atomic_int      n_sleeping;
    pthread_mutex_t mutex;
    pthread_cond_t  cond;

    // the job
    gp_cplan * cplan;
    int        i0, i1;
    atomic_int stop;
};

typedef struct {
    gp_threadpool * tp;
    int             ith;
} worker_arg;

void gp_threadpool_barrier(gp_threadpool * tp) {
    const int gen = atomic_load(&tp->generation);
    if (atomic_fetch_add(&tp->n_arrived, 1) == tp->n_threads - 1) {
        // the last one in releases the others
        atomic_store(&tp->n_arrived, 0);
        atomic_fetch_add(&tp->generation, 1);
        if (atomic_load(&tp->n_sleeping) > 0) {
            pthread_mutex_lock(&tp->mutex);
            pthread_cond_broadcast(&tp->cond);
            pthread_mutex_unlock(&tp->mutex);
        }
        return;
    }
    for (int i = 0; i < SPIN_ROUNDS; i++) {
        if (atomic_load(&tp->generation) != gen) return;
        CPU_RELAX();
    }
    for (int i = 0; i < YIELD_ROUNDS; i++) {
        if (atomic_load(&tp->generation) != gen) return;
        sched_yield();
    }
    // sleep: n_sleeping is raised before the generation is read again, so a release
    // that saw no sleeper happened before that read and is seen by it
    pthread_mutex_lock(&tp->mutex);
    atomic_fetch_add(&tp->n_sleeping, 1);
    while (atomic_load(&tp->generation) == gen) {
        pthread_cond_wait(&tp->cond, &tp->mutex);
    }
    atomic_fetch_sub(&tp->n_sleeping, 1);
    pthread_mutex_unlock(&tp->mutex);
}

void gp_barrier(const gp_params * p) {
    if (p->nth > 1) gp_threadpool_barrier(p->tp);
}

static void * worker_main(void * arg) {
    worker_arg a = *(worker_arg *)arg;
    free(arg);
    gp_threadpool * tp = a.tp;
    for (;;) {
        gp_threadpool_barrier(tp);              // a job starts (or the pool stops)
        if (atomic_load(&tp->stop)) break;
        gp_cplan_run_thread(tp->cplan, tp->i0, tp->i1, a.ith, tp);
    }
    return NULL;
}

gp_threadpool * gp_threadpool_new(int n_threads) {
    if (n_threads < 2) return NULL;
    pthread_once(&atfork_once, register_atfork);
    gp_threadpool * tp = calloc(1, sizeof(gp_threadpool));
    if (!tp) return NULL;
    tp->fork_gen = atomic_load(&fork_generation);
    tp->n_threads = n_threads;
    atomic_init(&tp->n_arrived, 0);
    atomic_init(&tp->generation, 0);
    atomic_init(&tp->n_sleeping, 0);
    atomic_init(&tp->stop, 0);
    pthread_mutex_init(&tp->mutex, NULL);
    pthread_cond_init(&tp->cond, NULL);
    tp->workers = calloc((size_t)n_threads - 1, sizeof(pthread_t));
    if (!tp->workers) {
        gp_threadpool_free(tp);
        return NULL;
    }
    for (int i = 1; i < n_threads; i++) {
        worker_arg * a = malloc(sizeof(worker_arg));
        if (!a) break;
        a->tp = tp;
        a->ith = i;
        if (pthread_create(&tp->workers[i - 1], NULL, worker_main, a) != 0) {
            free(a);
            break;
        }
        tp->n_started++;
    }
    if (tp->n_started != n_threads - 1) {
        gp_threadpool_free(tp);
        return NULL;
    }
    return tp;
}

int gp_threadpool_alive(const gp_threadpool * tp) {
    return tp && tp->fork_gen == atomic_load(&fork_generation);
}

void gp_threadpool_free(gp_threadpool * tp) {
    if (!tp) return;
    if (!gp_threadpool_alive(tp)) return;       // (after fork: no threads to stop; leaked)
    if (tp->n_started > 0) {
        // (a pool that could not start all its workers counts only those it has: the
        // ones waiting already compared with the larger count and did not release)
        tp->n_threads = tp->n_started + 1;
        atomic_thread_fence(memory_order_seq_cst);
        atomic_store(&tp->stop, 1);
        gp_threadpool_barrier(tp);
    }
    for (int i = 0; i < tp->n_started; i++) pthread_join(tp->workers[i], NULL);
    pthread_mutex_destroy(&tp->mutex);
    pthread_cond_destroy(&tp->cond);
    free(tp->workers);
    free(tp);
}

int gp_threadpool_n_threads(const gp_threadpool * tp) { return tp ? tp->n_threads : 1; }

void gp_threadpool_run(gp_threadpool * tp, gp_cplan * cplan, int i0, int i1) {
    tp->cplan = cplan;
    tp->i0 = i0;
    tp->i1 = i1;
    gp_threadpool_barrier(tp);                  // the workers start
    gp_cplan_run_thread(cplan, i0, i1, 0, tp);    // ends with a barrier: all are done
}
