//! The clock the windows' polls, the timer thread and its alarm measure
//! time by: nanoseconds since the first call. On Linux it is
//! CLOCK_MONOTONIC less a fixed base, so that an alarm (a timerfd on that
//! clock) is set for exactly the time asked.

use std::sync::OnceLock;
#[cfg(not(target_os = "linux"))]
use std::time::Instant;

/// Nanoseconds on a monotonic clock (from the first call): what polls and
/// a window budget measure rates against, in the timer and the job alike.
pub fn monotonic_ns() -> u64 {
    #[cfg(target_os = "linux")]
    {
        clock_monotonic_ns().saturating_sub(monotonic_base_ns())
    }
    #[cfg(not(target_os = "linux"))]
    {
        static BASE: OnceLock<Instant> = OnceLock::new();
        BASE.get_or_init(Instant::now).elapsed().as_nanos() as u64
    }
}

/// CLOCK_MONOTONIC at `monotonic_ns`' zero: a timerfd's alarm at
/// `monotonic_ns` t is at this plus t (ruby/window_alarm.rs).
#[cfg(target_os = "linux")]
pub fn monotonic_base_ns() -> u64 {
    static BASE: OnceLock<u64> = OnceLock::new();
    *BASE.get_or_init(clock_monotonic_ns)
}

#[cfg(target_os = "linux")]
fn clock_monotonic_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes the current time into `now` (through the vDSO: no
    // system call, callable anywhere).
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    (now.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(now.tv_nsec as u64)
}
