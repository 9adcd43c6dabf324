//! The time the windows' timer thread (ruby/window_timer.rs) wakes at,
//! which any thread may move. On Linux a timerfd: moving it is one system
//! call, and the thread wakes only when it fires. Elsewhere a park with a
//! timeout: moving it earlier wakes the thread, moving it later costs the
//! thread a wake-up at the old time, after which it sleeps on.
//!
//! `set` may be called from any thread, `wait` only from the thread that
//! called `bind` first. A forked child has no thread waiting: it makes an
//! alarm of its own and `forget`s its parent's (never `set` it: on Linux
//! that would move the parent's timer).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::thread::Thread;
#[cfg(not(target_os = "linux"))]
use std::time::Duration;

#[cfg(target_os = "linux")]
use super::monotonic_clock::monotonic_base_ns;
use super::monotonic_clock::monotonic_ns;

pub struct Alarm {
    /// The time set last (monotonic ns).
    at: AtomicU64,
    thread: OnceLock<Thread>,
    #[cfg(target_os = "linux")]
    fd: libc::c_int,
}

impl Alarm {
    /// None if the system gives no timer (no thread is started then).
    pub fn new() -> Option<Alarm> {
        #[cfg(target_os = "linux")]
        {
            // SAFETY: plain system call; the descriptor is owned by the
            // alarm, closed only by `forget`.
            let fd = unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_CLOEXEC) };
            if fd < 0 {
                return None;
            }
            Some(Alarm {
                at: AtomicU64::new(u64::MAX),
                thread: OnceLock::new(),
                fd,
            })
        }
        #[cfg(not(target_os = "linux"))]
        Some(Alarm {
            at: AtomicU64::new(u64::MAX),
            thread: OnceLock::new(),
        })
    }

    /// From the thread that will `wait`, before it does.
    pub fn bind(&self) {
        let _ = self.thread.set(std::thread::current());
    }

    /// Wake the thread at `at_ns` (monotonic ns; now or before: at once),
    /// instead of at the time set before.
    pub fn set(&self, at_ns: u64) {
        let before = self.at.swap(at_ns, Ordering::SeqCst);
        #[cfg(target_os = "linux")]
        {
            let _ = before;
            let raw = clock_monotonic_at(at_ns);
            let value = libc::timespec {
                tv_sec: (raw / 1_000_000_000) as libc::time_t,
                tv_nsec: (raw % 1_000_000_000) as libc::c_long,
            };
            let spec = libc::itimerspec {
                it_interval: libc::timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                },
                it_value: value,
            };
            // SAFETY: `fd` is this alarm's timerfd (open until `forget`,
            // which is called only where no thread sets it); `spec` lives
            // across the call. A failure (never expected) leaves the old
            // time: the thread then wakes within its longest sleep.
            unsafe {
                libc::timerfd_settime(
                    self.fd,
                    libc::TFD_TIMER_ABSTIME,
                    &spec,
                    std::ptr::null_mut(),
                )
            };
        }
        #[cfg(not(target_os = "linux"))]
        if at_ns < before {
            if let Some(thread) = self.thread.get() {
                thread.unpark();
            }
        }
    }

    /// Blocks the bound thread until the time set last has come (or a
    /// signal interrupts it: callers decide again after every return).
    pub fn wait(&self) {
        #[cfg(target_os = "linux")]
        {
            let mut expirations = 0u64;
            // SAFETY: reads 8 bytes into a u64 that outlives the call; a
            // timerfd blocks until it has expired at least once.
            let read = unsafe {
                libc::read(
                    self.fd,
                    (&mut expirations as *mut u64).cast(),
                    std::mem::size_of::<u64>(),
                )
            };
            if read < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted
            {
                // Never expected: rather than spin, sleep a while.
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
        #[cfg(not(target_os = "linux"))]
        loop {
            let at = self.at.load(Ordering::SeqCst);
            let now = monotonic_ns();
            if at <= now {
                break;
            }
            std::thread::park_timeout(Duration::from_nanos(at - now));
        }
    }

    /// In a forked child, at once, for the parent's alarm: release what it
    /// holds (async-signal-safe).
    pub fn forget(&self) {
        #[cfg(target_os = "linux")]
        // SAFETY: called in the child before any of its code runs, so the
        // descriptor is still the child's copy of the timerfd (the
        // parent's stays open); nothing sets or waits on it again.
        unsafe {
            libc::close(self.fd);
        }
    }
}

/// `monotonic_ns` on the clock a timerfd counts (CLOCK_MONOTONIC, which
/// `monotonic_ns` reads on Linux), at least 1 (0 would disarm the timer)
/// and at most ten years ahead (a timespec's seconds must not overflow).
#[cfg(target_os = "linux")]
fn clock_monotonic_at(ns: u64) -> u64 {
    let ns = ns.min(monotonic_ns().saturating_add(315_360_000_000_000_000));
    monotonic_base_ns().saturating_add(ns).max(1)
}
