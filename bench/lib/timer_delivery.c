/* bench/timer_delivery.rb: what waking a running thread RATE times a
 * second costs it, two ways. A worker thread does a fixed amount of
 * cache-bound work (pointer chasing through KIB kilobytes, as an
 * interpreter's loop touches its heap) and checks a flag as often as Ruby
 * checks its interrupts; when the flag is set it clears it and reads a
 * clock (a job's least work). The flag is set by
 *   none:   nobody (the baseline);
 *   thread: a second thread that sleeps on a timerfd to absolute
 *           deadlines (as src/ruby/window_timer.rs does) and sets it;
 *   signal: a POSIX timer whose signal the kernel delivers to the worker
 *           itself (timer_create, SIGEV_THREAD_ID), whose handler sets it.
 * Prints: the timer's fires (several may fold into one job), jobs run,
 * then the worker's CPU, the process's CPU (the timer thread's included)
 * and the wall time of the work (s). */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#define CHECK_EVERY 64

static atomic_int flag;
static atomic_int stop;
static atomic_long fires;
static long period_ns;

static double cpu_of(int who) {
  struct rusage usage;
  getrusage(who, &usage);
  return usage.ru_utime.tv_sec + usage.ru_utime.tv_usec / 1e6 + usage.ru_stime.tv_sec +
         usage.ru_stime.tv_usec / 1e6;
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec / 1e9;
}

static void *timer_thread(void *unused) {
  (void)unused;
  int fd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC);
  if (fd < 0) exit(1);
  struct timespec next;
  clock_gettime(CLOCK_MONOTONIC, &next);
  while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
    next.tv_nsec += period_ns;
    while (next.tv_nsec >= 1000000000L) {
      next.tv_nsec -= 1000000000L;
      next.tv_sec++;
    }
    struct itimerspec at = {.it_value = next};
    if (timerfd_settime(fd, TFD_TIMER_ABSTIME, &at, NULL) != 0) exit(1);
    uint64_t expirations;
    if (read(fd, &expirations, sizeof expirations) < 0 && errno != EINTR) exit(1);
    atomic_fetch_add_explicit(&fires, 1, memory_order_relaxed);
    atomic_store_explicit(&flag, 1, memory_order_release);
  }
  close(fd);
  return NULL;
}

static timer_t timer;

static void on_signal(int sig) {
  (void)sig;
  /* Fires the kernel folded into this signal count too. */
  int overrun = timer_getoverrun(timer);
  atomic_fetch_add_explicit(&fires, 1 + (overrun > 0 ? overrun : 0), memory_order_relaxed);
  atomic_store_explicit(&flag, 1, memory_order_release);
}

int main(int argc, char **argv) {
  if (argc != 5) return 2;
  const char *mode = argv[1];
  long rate = atol(argv[2]);
  long steps = atol(argv[3]);
  long kib = atol(argv[4]);
  if (rate <= 0 || rate > 1000000 || steps <= 0 || kib <= 0 || kib > (1L << 20)) return 2;
  size_t work_bytes = (size_t)kib << 10;
  period_ns = 1000000000L / rate;

  /* A random cycle through the array: every step a likely cache miss. */
  size_t slots = work_bytes / sizeof(uint32_t);
  uint32_t *next = malloc(work_bytes);
  if (!next) return 1;
  for (size_t i = 0; i < slots; i++) next[i] = (uint32_t)i;
  uint64_t seed = 88172645463325252ULL;
  for (size_t i = slots - 1; i > 0; i--) {
    seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
    size_t j = seed % i; /* Sattolo: one cycle through every slot */
    uint32_t t = next[i];
    next[i] = next[j];
    next[j] = t;
  }

  pthread_t thread;
  if (strcmp(mode, "thread") == 0) {
    if (pthread_create(&thread, NULL, timer_thread, NULL) != 0) return 1;
  } else if (strcmp(mode, "signal") == 0) {
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = on_signal;
    action.sa_flags = SA_RESTART;
    sigemptyset(&action.sa_mask);
    if (sigaction(SIGRTMIN + 3, &action, NULL) != 0) return 1;
    struct sigevent event;
    memset(&event, 0, sizeof event);
    event.sigev_notify = SIGEV_THREAD_ID;
    event.sigev_signo = SIGRTMIN + 3;
    event._sigev_un._tid = (pid_t)syscall(SYS_gettid);
    if (timer_create(CLOCK_MONOTONIC, &event, &timer) != 0) return 1;
    struct timespec period = {period_ns / 1000000000L, period_ns % 1000000000L};
    struct itimerspec every = {.it_interval = period, .it_value = period};
    if (timer_settime(timer, 0, &every, NULL) != 0) return 1;
  } else if (strcmp(mode, "none") != 0) {
    return 2;
  }

  double wall = now_s(), cpu = cpu_of(RUSAGE_THREAD), process_cpu = cpu_of(RUSAGE_SELF);
  uint32_t at = 0;
  long jobs = 0;
  struct timespec job_clock;
  for (long s = 0; s < steps; s++) {
    at = next[at];
    if ((s & (CHECK_EVERY - 1)) == 0 && atomic_load_explicit(&flag, memory_order_relaxed)) {
      atomic_store_explicit(&flag, 0, memory_order_relaxed);
      clock_gettime(CLOCK_MONOTONIC, &job_clock);
      jobs++;
    }
  }
  double worker_cpu = cpu_of(RUSAGE_THREAD) - cpu;
  wall = now_s() - wall;

  atomic_store(&stop, 1);
  if (strcmp(mode, "thread") == 0) pthread_join(thread, NULL);
  if (strcmp(mode, "signal") == 0) timer_delete(timer);
  process_cpu = cpu_of(RUSAGE_SELF) - process_cpu;
  printf("%ld %ld %.6f %.6f %.6f %u\n", atomic_load(&fires), jobs, worker_cpu, process_cpu, wall, at);
  return 0;
}
