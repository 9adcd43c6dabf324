/* bench/wake_cost.rb: a thread that only sleeps to absolute deadlines,
 * PERIOD_NS apart, for SECONDS, then prints its own CPU time (the kernel's
 * accounting of its wake-ups and nothing else). TIMERSLACK_1US: as the
 * windows' timer thread asks (src/ruby/window_timer.rs). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <time.h>

static long period_ns;
static int seconds;
static int slack_1us;

static void *run(void *unused) {
  (void)unused;
  if (slack_1us) prctl(PR_SET_TIMERSLACK, 1000UL);
  struct timespec next;
  clock_gettime(CLOCK_MONOTONIC, &next);
  long wakes = (long)seconds * 1000000000L / period_ns;
  for (long i = 0; i < wakes; i++) {
    next.tv_nsec += period_ns;
    while (next.tv_nsec >= 1000000000L) {
      next.tv_nsec -= 1000000000L;
      next.tv_sec++;
    }
    clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL);
  }
  struct rusage usage;
  getrusage(RUSAGE_THREAD, &usage);
  double cpu = usage.ru_utime.tv_sec + usage.ru_utime.tv_usec / 1e6 + usage.ru_stime.tv_sec +
               usage.ru_stime.tv_usec / 1e6;
  printf("%ld %.6f\n", wakes, cpu);
  return NULL;
}

int main(int argc, char **argv) {
  if (argc != 4) return 2;
  period_ns = atol(argv[1]);
  seconds = atoi(argv[2]);
  slack_1us = atoi(argv[3]);
  if (period_ns <= 0 || seconds <= 0) return 2;
  pthread_t thread;
  if (pthread_create(&thread, NULL, run, NULL) != 0) return 1;
  pthread_join(thread, NULL);
  return 0;
}
