//! The thread that wakes the postponed job for sampling windows' polls
//! (sampler/windows/mod.rs): one per process, started with the first collector
//! that uses windows.
//!
//! It only ever calls the trigger it is given (the registry's
//! `request_measurement`: async-signal-safe, no allocation, no GVL). From
//! a thread Ruby does not know, that is allowed: Ruby 3.3's
//! `rb_postponed_job_trigger` is documented as callable from any thread,
//! and before it `rb_postponed_job_register_one` takes the main Ractor's
//! execution context when the calling thread has none (`get_valid_ec` in
//! vm_trace.c, which profilers' signal handlers on other threads rely on). After each trigger it waits until
//! the job has run before it sleeps again: a process idle in IO or sleep
//! runs no job, so it gets no wake-ups. At exit it is stopped, and waited
//! for, before Ruby tears down what the trigger writes to. In a forked
//! child (where it does not exist) the next job starts another.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::thread::Thread;
use std::time::{Duration, Instant};

/// Nanoseconds on a monotonic clock (from the first call): what polls and
/// a window budget measure rates against, here and in the job alike.
pub fn monotonic_ns() -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    BASE.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// When to trigger the job next (monotonic ns); `u64::MAX`: not needed.
static DEADLINE: AtomicU64 = AtomicU64::new(u64::MAX);
/// Until when (monotonic ns) the thread sleeps: the job wakes it only for
/// a deadline before that. (Waking costs a system call and two context
/// switches, and the job runs for every batch of samples, not only when
/// the thread asked.)
static SLEEPING_UNTIL: AtomicU64 = AtomicU64::new(0);
/// Triggered, and the job has not run since.
static JOB_PENDING: AtomicBool = AtomicBool::new(false);
static STOP: AtomicBool = AtomicBool::new(false);
/// The thread of this process, if any (a leaked handle per thread started:
/// one per process that profiles with windows).
static THREAD: AtomicPtr<Thread> = AtomicPtr::new(std::ptr::null_mut());
/// The process the thread runs in (after fork, the child has none).
static OWNER: AtomicU32 = AtomicU32::new(0);
/// The thread's loop has ended.
static EXITED: AtomicBool = AtomicBool::new(true);

fn wake() {
    let thread = THREAD.load(Ordering::Acquire);
    if !thread.is_null() {
        // SAFETY: a leaked Box, never freed; unparking a thread that is
        // gone (a forked child's copy) does nothing.
        unsafe { (*thread).unpark() };
    }
}

/// From the postponed job (GVL held): the job ran; call `trigger` (which
/// asks for it again) `in_ns` from now (None: only when asked again).
/// Starts the thread in this process if it has none.
pub fn schedule(in_ns: Option<u64>, trigger: fn()) {
    JOB_PENDING.store(false, Ordering::Release);
    let deadline = in_ns.map_or(u64::MAX, |d| monotonic_ns().saturating_add(d));
    // SeqCst, with the thread's store of SLEEPING_UNTIL and its second
    // load of DEADLINE: either it sees this deadline, or this sees how
    // long it sleeps.
    DEADLINE.store(deadline, Ordering::SeqCst);
    if STOP.load(Ordering::Relaxed) {
        return;
    }
    if OWNER.load(Ordering::Acquire) != std::process::id() {
        start(trigger);
        wake();
    } else if deadline < SLEEPING_UNTIL.load(Ordering::SeqCst) {
        wake();
    }
}

/// Parks the thread until `until` (monotonic ns) at the latest, unless
/// the deadline changed from `deadline` meanwhile.
fn sleep_until(until: u64, deadline: u64) {
    SLEEPING_UNTIL.store(until, Ordering::SeqCst);
    if DEADLINE.load(Ordering::SeqCst) == deadline {
        let now = monotonic_ns();
        if until > now {
            std::thread::park_timeout(Duration::from_nanos(until - now));
        }
    }
    // Awake: a job's deadline must wake it again only if before now.
    SLEEPING_UNTIL.store(0, Ordering::SeqCst);
}

fn start(trigger: fn()) {
    EXITED.store(false, Ordering::Release);
    OWNER.store(std::process::id(), Ordering::Release);
    let spawned = std::thread::Builder::new()
        .name("memprofiler-windows".into())
        .stack_size(64 * 1024)
        .spawn(move || run(trigger));
    match spawned {
        Ok(handle) => {
            let thread = Box::into_raw(Box::new(handle.thread().clone()));
            THREAD.store(thread, Ordering::Release);
        }
        Err(_) => {
            // No thread: polls come from GCs only (windows still unbiased,
            // just armed less often).
            EXITED.store(true, Ordering::Release);
        }
    }
}

fn run(trigger: fn()) {
    // Wake within microseconds of a deadline, not Linux's default 50 us
    // slack.
    #[cfg(target_os = "linux")]
    // SAFETY: sets a property of this thread only.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1_000u64)
    };
    while !STOP.load(Ordering::Acquire) {
        let deadline = DEADLINE.load(Ordering::SeqCst);
        let now = monotonic_ns();
        if JOB_PENDING.load(Ordering::Acquire) {
            // Until the job has run (it wakes the thread with its next
            // deadline); a process idle in IO runs none.
            sleep_until(now.saturating_add(100_000_000), deadline);
        } else if deadline == u64::MAX {
            sleep_until(now.saturating_add(1_000_000_000), deadline);
        } else if now < deadline {
            sleep_until(deadline, deadline);
        } else {
            JOB_PENDING.store(true, Ordering::Release);
            DEADLINE.store(u64::MAX, Ordering::Release);
            if !STOP.load(Ordering::Acquire) {
                trigger();
            }
        }
    }
    EXITED.store(true, Ordering::Release);
}

/// At exit (GVL held): stops the thread and waits for it (at most 200 ms),
/// so that it never triggers a job in a VM being torn down.
pub fn stop_at_exit() {
    STOP.store(true, Ordering::Release);
    if OWNER.load(Ordering::Acquire) != std::process::id() {
        return;
    }
    wake();
    let began = Instant::now();
    while !EXITED.load(Ordering::Acquire) && began.elapsed() < Duration::from_millis(200) {
        std::thread::sleep(Duration::from_micros(200));
        wake();
    }
}
