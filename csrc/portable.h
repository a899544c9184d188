/* portable.h: what the kernel's units (csrc/kernel_impl.h) need from the platform, for gcc, clang (zig cc) and
MSVC, on POSIX (pthreads) and Windows (Win32 threads): exported symbols, no contraction of a * b + c, a mutex and
two condition variables, atomics, detached threads, a monotonic clock, a yield, and x86 CPU features (cpuid +
xgetbv). Nothing here computes: the arithmetic, and so the bits, are in the units. Every helper is static inline:
each unit includes this file and keeps what it uses.

Exactness flags (build_kernels.py passes them; the pragmas below repeat what a compiler honours):
  gcc / clang   -ffp-contract=off (gcc ignores the STDC pragma, clang honours it), never -ffast-math;
  MSVC          /fp:precise (its default) plus `#pragma fp_contract(off)`: VS 2019 may contract under
                /fp:precise on some targets, VS 2022 does not, the pragma makes both say the same. */
#ifndef ROWKERNEL_PORTABLE_H
#define ROWKERNEL_PORTABLE_H

/* clock_gettime and CLOCK_MONOTONIC under -std=c11 with glibc (before any system header) */
#if !defined(_WIN32) && !defined(__APPLE__) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L
#endif

#include <float.h>
#include <stdint.h>

#if defined(_MSC_VER) && !defined(__clang__)
#define RK_MSVC 1
#pragma fp_contract(off)
#pragma float_control(precise, on)
#else
#define RK_MSVC 0
#endif
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

/* x87 arithmetic (32-bit x86 without SSE2) keeps extended precision between operations: neither the
   kernel's float chains nor the software fma's error-free sum would be what they say */
#if defined(FLT_EVAL_METHOD) && FLT_EVAL_METHOD == 2
#error "rowkernel needs IEEE single and double arithmetic (FLT_EVAL_METHOD 0 or 1): on 32-bit x86 add -msse2 -mfpmath=sse"
#endif

#if defined(__x86_64__) || defined(__i386__) || defined(_M_X64) || defined(_M_IX86)
#define RK_X86 1
#else
#define RK_X86 0
#endif
#if defined(__aarch64__) || defined(_M_ARM64)
#define RK_ARM64 1
#else
#define RK_ARM64 0
#endif

/* A pool worker's stack: its deepest call (a product's register block, an attention pair) needs a few KB, so
   512 KiB, not the platform's default (8 MB on Linux, reserved per thread): 64 workers then reserve 32 MB of
   address space, not 512 MB, which matters under `ulimit -v` (shared JupyterHubs, HPC login nodes). */
#define RK_WORKER_STACK (512 * 1024)

#if defined(_WIN32)
#define RK_EXPORT __declspec(dllexport)
#elif defined(__GNUC__)
#define RK_EXPORT __attribute__((visibility("default")))
#else
#define RK_EXPORT
#endif

/* a function compiled for a wider instruction set than the build's baseline, chosen at run time
   (gcc/clang need the attribute; MSVC compiles intrinsics without it) */
#if defined(__GNUC__)
#define RK_TARGET(s) __attribute__((target(s)))
#define RK_UNROLL _Pragma("GCC unroll 16")
#else
#define RK_TARGET(s)
#define RK_UNROLL
#endif

/* ---- threads, locks, condition variables ---------------------------------------------------- */
#if defined(_WIN32)
#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#include <windows.h>
typedef SRWLOCK rk_mutex;
typedef CONDITION_VARIABLE rk_cond;
#define RK_MUTEX_INIT SRWLOCK_INIT
#define RK_COND_INIT CONDITION_VARIABLE_INIT
static inline void rk_mutex_lock(rk_mutex *m) { AcquireSRWLockExclusive(m); }
static inline int rk_mutex_trylock(rk_mutex *m) { return TryAcquireSRWLockExclusive(m) ? 0 : 1; }   /* 0: taken */
static inline void rk_mutex_unlock(rk_mutex *m) { ReleaseSRWLockExclusive(m); }
static inline void rk_cond_wait(rk_cond *c, rk_mutex *m) { SleepConditionVariableSRW(c, m, INFINITE, 0); }
static inline void rk_cond_broadcast(rk_cond *c) { WakeAllConditionVariable(c); }
static inline void rk_thread_yield(void) { SwitchToThread(); }

typedef void *(*rk_thread_fn)(void *);
typedef struct { rk_thread_fn fn; void *arg; } rk_thread_start_t;
static inline DWORD WINAPI rk_thread_trampoline(LPVOID p)
{
    rk_thread_start_t s = *(rk_thread_start_t *)p;
    HeapFree(GetProcessHeap(), 0, p);
    s.fn(s.arg);
    return 0;
}
/* start a detached thread running fn(arg); 0 on success */
static inline int rk_thread_start(rk_thread_fn fn, void *arg)
{
    rk_thread_start_t *s = (rk_thread_start_t *)HeapAlloc(GetProcessHeap(), 0, sizeof *s);
    if (!s) return -1;
    s->fn = fn, s->arg = arg;
    HANDLE h = CreateThread(NULL, RK_WORKER_STACK, rk_thread_trampoline, s, STACK_SIZE_PARAM_IS_A_RESERVATION, NULL);
    if (!h) { HeapFree(GetProcessHeap(), 0, s); return -1; }
    CloseHandle(h);
    return 0;
}
static inline double rk_now_s(void)
{
    LARGE_INTEGER t, f;
    QueryPerformanceCounter(&t);
    QueryPerformanceFrequency(&f);
    return (double)t.QuadPart / (double)f.QuadPart;
}
/* Windows has no fork: nothing to repair in a child */
static inline void rk_at_fork_child(void (*fn)(void)) { (void)fn; }
#else
#include <pthread.h>
#include <sched.h>
#include <time.h>
typedef pthread_mutex_t rk_mutex;
typedef pthread_cond_t rk_cond;
#define RK_MUTEX_INIT PTHREAD_MUTEX_INITIALIZER
#define RK_COND_INIT PTHREAD_COND_INITIALIZER
static inline void rk_mutex_lock(rk_mutex *m) { pthread_mutex_lock(m); }
static inline int rk_mutex_trylock(rk_mutex *m) { return pthread_mutex_trylock(m); }
static inline void rk_mutex_unlock(rk_mutex *m) { pthread_mutex_unlock(m); }
static inline void rk_cond_wait(rk_cond *c, rk_mutex *m) { pthread_cond_wait(c, m); }
static inline void rk_cond_broadcast(rk_cond *c) { pthread_cond_broadcast(c); }
static inline void rk_thread_yield(void) { sched_yield(); }
typedef void *(*rk_thread_fn)(void *);
static inline int rk_thread_start(rk_thread_fn fn, void *arg)
{
    pthread_t t;
    pthread_attr_t attr;
    if (pthread_attr_init(&attr) != 0) return -1;
    pthread_attr_setstacksize(&attr, RK_WORKER_STACK);      /* may fail below PTHREAD_STACK_MIN: the default stays */
    const int rc = pthread_create(&t, &attr, fn, arg);
    pthread_attr_destroy(&attr);
    if (rc != 0) return -1;
    pthread_detach(t);
    return 0;
}
static inline double rk_now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
static inline void rk_at_fork_child(void (*fn)(void)) { pthread_atfork(NULL, NULL, fn); }
#endif

/* ---- atomics: C11 where the compiler has them, Interlocked on MSVC ---------------------------- */
#if RK_MSVC
#include <intrin.h>
typedef volatile long rk_atomic;
/* Interlocked operations are full barriers: stronger than the acquire / release the kernel asks for */
static inline long rk_load(rk_atomic *a) { return _InterlockedCompareExchange(a, 0, 0); }
static inline void rk_store(rk_atomic *a, long v) { _InterlockedExchange(a, v); }
static inline long rk_fetch_add(rk_atomic *a, long v) { return _InterlockedExchangeAdd(a, v); }
/* 64 bits whatever `long` is (32 on Windows): the pool's job word */
typedef volatile long long rk_atomic64;
static inline long long rk_load64(rk_atomic64 *a) { return _InterlockedCompareExchange64(a, 0, 0); }
static inline void rk_store64(rk_atomic64 *a, long long v) { _InterlockedExchange64(a, v); }
static inline int rk_cas64(rk_atomic64 *a, long long expect, long long v)
{
    return _InterlockedCompareExchange64(a, v, expect) == expect;
}
#else
#include <stdatomic.h>
typedef atomic_long rk_atomic;
static inline long rk_load(rk_atomic *a) { return atomic_load_explicit(a, memory_order_acquire); }
static inline void rk_store(rk_atomic *a, long v) { atomic_store_explicit(a, v, memory_order_seq_cst); }
static inline long rk_fetch_add(rk_atomic *a, long v) { return atomic_fetch_add_explicit(a, v, memory_order_acq_rel); }
typedef atomic_llong rk_atomic64;
static inline long long rk_load64(rk_atomic64 *a) { return atomic_load_explicit(a, memory_order_acquire); }
static inline void rk_store64(rk_atomic64 *a, long long v) { atomic_store_explicit(a, v, memory_order_seq_cst); }
static inline int rk_cas64(rk_atomic64 *a, long long expect, long long v)
{
    return atomic_compare_exchange_strong_explicit(a, &expect, v, memory_order_acq_rel, memory_order_acquire);
}
#endif

/* a spinning thread's hint to the core (x86 pause, arm64 yield) */
#if RK_X86
#include <immintrin.h>
static inline void rk_relax(void) { _mm_pause(); }
#elif RK_ARM64 && RK_MSVC
static inline void rk_relax(void) { __yield(); }
#elif RK_ARM64
static inline void rk_relax(void) { __asm__ __volatile__("yield"); }
#else
static inline void rk_relax(void) {}
#endif

/* ---- x86 CPU features: AVX2 + FMA + F16C with the OS saving the YMM registers --------------------- */
#if RK_X86
#if RK_MSVC
static inline void rk_cpuid(int leaf, int sub, unsigned r[4]) { int v[4]; __cpuidex(v, leaf, sub); for (int i = 0; i < 4; i++) r[i] = (unsigned)v[i]; }
static inline uint64_t rk_xgetbv0(void) { return _xgetbv(0); }
#else
#include <cpuid.h>
static inline void rk_cpuid(int leaf, int sub, unsigned r[4]) { __cpuid_count(leaf, sub, r[0], r[1], r[2], r[3]); }
static inline uint64_t rk_xgetbv0(void)
{
    unsigned lo, hi;
    __asm__ __volatile__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}
#endif
/* FMA alone (the portable path's scalar fma instruction); needs the OS to save XMM/YMM state */
static inline int rk_cpu_fma(void)
{
    unsigned r[4];
    rk_cpuid(0, 0, r);
    if (r[0] < 1) return 0;
    rk_cpuid(1, 0, r);
    const int osxsave = (r[2] >> 27) & 1, avx = (r[2] >> 28) & 1, fma = (r[2] >> 12) & 1;
    return osxsave && avx && fma && (rk_xgetbv0() & 6) == 6;
}
static inline int rk_cpu_avx2_fma_f16c(void)
{
    unsigned r[4];
    if (!rk_cpu_fma()) return 0;
    rk_cpuid(1, 0, r);
    const int f16c = (r[2] >> 29) & 1;
    rk_cpuid(0, 0, r);
    if (r[0] < 7) return 0;
    rk_cpuid(7, 0, r);
    return f16c && ((r[1] >> 5) & 1);
}
/* AVX-512 F and BW on top of AVX2 + FMA + F16C, with the OS saving the opmask and all 512-bit registers
   (XCR0 bits 5, 6, 7 besides SSE and AVX state) */
static inline int rk_cpu_avx512(void)
{
    unsigned r[4];
    if (!rk_cpu_avx2_fma_f16c()) return 0;
    rk_cpuid(7, 0, r);
    const int f = (r[1] >> 16) & 1, bw = (r[1] >> 30) & 1;
    return f && bw && (rk_xgetbv0() & 0xe6) == 0xe6;
}
/* AVX-512 VNNI (vpdpbusd): CPUID leaf 7, ECX bit 11 (the int8 numerics' fastest dot, csrc/intdot.c) */
static inline int rk_cpu_avx512vnni(void)
{
    unsigned r[4];
    rk_cpuid(0, 0, r);
    if (r[0] < 7) return 0;
    rk_cpuid(7, 0, r);
    return (r[2] >> 11) & 1;
}
#else
static inline int rk_cpu_avx2_fma_f16c(void) { return 0; }
static inline int rk_cpu_avx512(void) { return 0; }
#endif

#endif
