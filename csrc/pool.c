/* pool.c: the kernel's thread pool, one struct (`pool`) for all its state.

Why. A decode step runs about 200 jobs (products, attention) a few tens of microseconds each, with Python in
between; threads must take part in each without a wake-up per job, and the bits must not depend on how many
took part. A job (one product, or one layer's attention) is cut into CHUNKS per thread, more chunks than threads,
and every participant (the caller and the active workers) claims chunks one at a time from one 64-bit word until
none is left; the caller then waits for the chunks others claimed. A chunk is a contiguous range of output
strips (attention: of row-head pairs), so every output element is still one chain computed by one thread and
the bits do not depend on the thread count or on who ran which chunk. Why claim instead of a fixed share per
thread: with more threads than free cores (other programs, the test suite's workers) a worker can lose its
core for a scheduler tick, and with fixed shares every product then waited for it (measured 2026-12-03 on an
Intel Xeon, 2 cores, three busy processes beside it: 2 threads decoded 2.2-2.4 tokens/s against 26-28 with 1
thread; docs/kernel.md); with claiming, the caller and the running workers take the chunks a descheduled
worker never claimed.

Layout. The job word: job number (24 bits) | threads (8) | chunks (16) | next chunk (16). A claim is a
compare-and-swap of the whole word, so a worker can only claim a chunk of the job the word names, and it reads
pool.fn and pool.ctx after its claim: that job cannot end (nor the next begin) before the claimed chunk is done.
Only a worker whose id is below the job's thread count takes part (its scratch buffer exists). A claim could be
confused with another job's only if a worker stalled between reading the word and its compare-and-swap while
a multiple of 2^24 jobs ran (minutes of decoding, about 200 jobs a token, during which that thread never
ran) and the word came back to exactly the same value: ruled out in practice, stated here because the 24
bits are a choice. Each thread has a scratch buffer (pool.buf[i]) that a job may ask for (pool_run's need).

Paths. Workers spin on the wake counter (pool.gen) for SPIN_S after their last job, then sleep on a condition
variable. One job at a time (pool.lock); a caller that finds the pool busy (another Python thread) runs its
job alone with scratch of its own. After fork the child has no workers. pthreads on POSIX, Win32 threads, SRW
locks and condition variables on Windows (portable.h). tests/test_kernel_tsan.py runs it under ThreadSanitizer. */
#include "kernel_impl.h"

#define SPIN 4000
#define CHUNKS 3                        /* chunks per thread */

/* Workers spin this long after a job before they sleep: a decode step's products come every few tens of
   microseconds with Python in between, and a worker woken from sleep for each (a futex wake, then the
   scheduler) cost more than its half of the product (measured: 2 threads decoded slower than 1). */
#define SPIN_S 0.002

static struct {
    rk_mutex lock;                      /* held by the caller whose job runs (and by set_threads) */
    rk_mutex wake_mu;                   /* guards the sleeps on wake_cv and park_cv */
    rk_cond wake_cv, park_cv;
    int size, started, fork_hook;       /* threads in use (the caller too), workers started, atfork set */
    rk_atomic active;                   /* workers 1..active take parts; the others are parked */
    rk_atomic gen;                      /* wakes the workers: changes with every job */
    long park_gen;                      /* gen when set_threads last changed active (under wake_mu) */
    rk_atomic64 word;                   /* the job word (above) */
    rk_atomic done;                     /* chunks of the current job finished */
    long long num;                      /* jobs started (under lock) */
    void (*fn)(void *, int, int, int);  /* the current job */
    void *ctx;
    long seen[MAXT];                    /* gen when worker i was started (under lock) */
    float *buf[MAXT];                   /* thread i's scratch, cap[i] floats */
    size_t cap[MAXT];
} pool = {.lock = RK_MUTEX_INIT, .wake_mu = RK_MUTEX_INIT, .wake_cv = RK_COND_INIT, .park_cv = RK_COND_INIT,
          .size = 1};

#define WORD_NUM(v) ((unsigned long long)(v) >> 40)
#define WORD_THREADS(v) ((int)(((unsigned long long)(v) >> 32) & 0xff))
#define WORD_CHUNKS(v) ((int)(((unsigned long long)(v) >> 16) & 0xffff))
#define WORD_NEXT(v) ((int)((unsigned long long)(v) & 0xffff))

/* claim and run chunks of the job in the word until none is left (or the word names another job) */
static void take_chunks(int id)
{
    long long v = rk_load64(&pool.word);
    const unsigned long long num = WORD_NUM(v);
    if (id >= WORD_THREADS(v))
        return;
    for (;;) {
        if (WORD_NUM(v) != num || WORD_NEXT(v) >= WORD_CHUNKS(v))
            return;
        if (!rk_cas64(&pool.word, v, v + 1)) {
            v = rk_load64(&pool.word);
            continue;
        }
        pool.fn(pool.ctx, WORD_NEXT(v), WORD_CHUNKS(v), id);   /* read after the claim: this job's */
        rk_fetch_add(&pool.done, 1);
        v = rk_load64(&pool.word);
    }
}

/* arg: the worker's id; it starts from the wake counter read under pool.lock when it was created (no job
   has started since: a worker that starts late still sees the first job) */
static void *pool_worker(void *arg)
{
    const int id = (int)(uintptr_t)arg;
    long seen = pool.seen[id];
    for (;;) {
        long g;
        const double until = rk_now_s() + SPIN_S;
        for (int spins = 0; (g = rk_load(&pool.gen)) == seen; spins++) {
            if ((spins & 63) || rk_now_s() < until) {
                if ((spins & 63) == 63) rk_thread_yield();   /* more threads than cores: let the others run */
                else rk_relax();
                continue;
            }
            rk_mutex_lock(&pool.wake_mu);
            while ((g = rk_load(&pool.gen)) == seen) rk_cond_wait(&pool.wake_cv, &pool.wake_mu);
            rk_mutex_unlock(&pool.wake_mu);
            break;
        }
        seen = g;
        take_chunks(id);
        if (id > rk_load(&pool.active)) {          /* fewer threads asked for: sleep until needed again */
            rk_mutex_lock(&pool.wake_mu);
            while (id > rk_load(&pool.active)) rk_cond_wait(&pool.park_cv, &pool.wake_mu);
            seen = pool.park_gen;                   /* a job started after set_threads woke us is ours too */
            rk_mutex_unlock(&pool.wake_mu);
        }
    }
    return NULL;
}

/* fn(ctx, chunk, chunks, thread) over `items` units on `threads` threads (the caller holds pool.lock): a chunk
   is fn's own range of the units, thread indexes a per-thread scratch buffer */
static void run_parts(void (*fn)(void *, int, int, int), void *ctx, int threads, int64_t items)
{
    int64_t chunks = (int64_t)threads * CHUNKS;
    if (chunks > items) chunks = items;
    if (threads <= 1 || chunks <= 1 || pool.started == 0) { fn(ctx, 0, 1, 0); return; }
    pool.fn = fn, pool.ctx = ctx;
    rk_store(&pool.done, 0);
    pool.num++;
    rk_store64(&pool.word, (long long)((((unsigned long long)pool.num & 0xffffff) << 40) |
                                       ((unsigned long long)threads << 32) | ((unsigned long long)chunks << 16)));
    rk_mutex_lock(&pool.wake_mu);
    rk_store(&pool.gen, (long)((unsigned long)rk_load(&pool.gen) + 1u));  /* only a caller holding pool.lock writes */
    rk_cond_broadcast(&pool.wake_cv);
    rk_mutex_unlock(&pool.wake_mu);
    take_chunks(0);
    for (int spins = 0; rk_load(&pool.done) < chunks; spins++) {
        if (spins < SPIN) rk_relax();
        else rk_thread_yield();             /* a worker that lost its core holds a chunk: give it ours */
    }
}

static void pool_after_fork(void)
{
    const rk_mutex fresh = RK_MUTEX_INIT;
    const rk_cond fresh_cv = RK_COND_INIT;
    pool.lock = fresh, pool.wake_mu = fresh;
    pool.wake_cv = fresh_cv, pool.park_cv = fresh_cv;
    pool.started = 0, pool.size = 1;
    rk_store(&pool.active, 0);
}

/* grow a thread's scratch to at least `need` floats; 0 on success */
static int ensure_scratch(float **buf, size_t *cap, size_t need)
{
    if (*cap >= need) return 0;
    free(*buf);
    *buf = (float *)malloc(need * sizeof(float));
    *cap = *buf ? need : 0;
    return *buf ? 0 : -1;
}

int pool_run(void (*fn)(void *, int, int, int), void *ctx, int64_t items, size_t need, float ***scratch)
{
    float *own = NULL, *bufs[MAXT];
    int rc = 0;
    if (rk_mutex_trylock(&pool.lock) == 0) {
        const int threads = (int)(items < pool.size ? items : pool.size);
        for (int i = 0; i < threads && need; i++) rc |= ensure_scratch(&pool.buf[i], &pool.cap[i], need);
        if (scratch) *scratch = pool.buf;
        if (rc == 0) run_parts(fn, ctx, threads, items);
        rk_mutex_unlock(&pool.lock);
        return rc;
    }
    if (need && !(own = (float *)malloc(need * sizeof(float)))) return -1;
    bufs[0] = own;
    if (scratch) *scratch = bufs;
    fn(ctx, 0, 1, 0);
    free(own);
    return rc;
}

int pool_set_threads(int n)
{
    rk_mutex_lock(&pool.lock);
    if (!pool.fork_hook && n > 1) {
        rk_at_fork_child(pool_after_fork);
        pool.fork_hook = 1;
    }
    while (pool.started < n - 1) {
        const int id = pool.started + 1;
        pool.seen[id] = rk_load(&pool.gen);
        if (rk_thread_start(pool_worker, (void *)(uintptr_t)id) != 0) break;
        pool.started++;
    }
    pool.size = pool.started + 1 < n ? pool.started + 1 : n;
    rk_mutex_lock(&pool.wake_mu);
    rk_store(&pool.active, pool.size - 1);
    pool.park_gen = rk_load(&pool.gen);     /* pool.lock is held: no job is running */
    rk_cond_broadcast(&pool.park_cv);
    rk_mutex_unlock(&pool.wake_mu);
    const int in_use = pool.size;
    rk_mutex_unlock(&pool.lock);
    return in_use;
}
