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

use super::window_timer::monotonic_ns;

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
            let raw = monotonic_raw_ns(at_ns);
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
            unsafe {
                libc::read(
                    self.fd,
                    (&mut expirations as *mut u64).cast(),
                    std::mem::size_of::<u64>(),
                )
            };
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

    /// In a forked child, for the parent's alarm: release what it holds.
    pub fn forget(&self) {
        #[cfg(target_os = "linux")]
        // SAFETY: the child's copy of the descriptor; the parent's stays
        // open. No thread of the child waits on it or sets it again.
        unsafe {
            libc::close(self.fd);
        }
    }
}

/// `monotonic_ns` on the clock a timerfd counts (CLOCK_MONOTONIC, which
/// `Instant` reads on Linux), saturating far in the future.
#[cfg(target_os = "linux")]
fn monotonic_raw_ns(ns: u64) -> u64 {
    static BASE: OnceLock<u64> = OnceLock::new();
    let base = *BASE.get_or_init(|| {
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: writes the current time into `now`.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
        let raw = (now.tv_sec as u64) * 1_000_000_000 + now.tv_nsec as u64;
        raw.saturating_sub(monotonic_ns())
    });
    // At most ten years ahead: a timespec's seconds must not overflow.
    base.saturating_add(ns.min(monotonic_ns().saturating_add(315_360_000_000_000_000)))
}
