//! The thread that wakes the postponed job for sampling windows' polls
//! (sampler/windows/mod.rs), and while a flush's leftovers are released
//! (ruby/collector/flush.rs): one per process, started with the first
//! collector that asks.
//!
//! It only ever calls the trigger it is given (the registry's
//! `request_measurement`: async-signal-safe, no allocation, no GVL). From
//! a thread Ruby does not know, that is allowed: Ruby 3.3's
//! `rb_postponed_job_trigger` is documented as callable from any thread,
//! and before it `rb_postponed_job_register_one` takes the main Ractor's
//! execution context when the calling thread has none (`get_valid_ec` in
//! vm_trace.c, which profilers' signal handlers on other threads rely on).
//!
//! After each trigger it waits until the job has run. Ruby runs the job on
//! the thread it flagged, the one that held the GVL last (`get_valid_ec`
//! and Ruby bug #20197); a pool thread that then waits on its queue while
//! the others serve requests holds the job back as long, and windows go
//! by unhooked. So a job that has not run is triggered again: on Ruby 3.3
//! and later by each thread that takes the GVL (a thread event hook), and
//! on every Ruby by this thread after 0.2 ms, then after waits that grow
//! eightfold (before 3.3, every 1.6 ms while the job ran in the last
//! 0.1 s). A process idle in IO or sleep runs no job: its wake-ups thin
//! out to ten a second.
//!
//! It sleeps on a timerfd (Linux), which the job re-arms for its next
//! deadline without waking it: one wake-up a poll. Parked with a timeout
//! instead (elsewhere, or without a timerfd), the thread woke twice for
//! most polls: to trigger the job, and again when its check on the job
//! came due (or the job woke it for a nearer deadline), only to sleep
//! until the job's deadline.
//!
//! At exit it is stopped, and waited for, before Ruby tears down what the
//! trigger writes to. In a forked child (where it does not exist) the next
//! job starts another.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::thread::Thread;
use std::time::{Duration, Instant};

use sampler::windows::PollTime;

/// Nanoseconds on a monotonic clock (from the first call): what polls and
/// a window budget measure rates against, here and in the job alike.
pub fn monotonic_ns() -> u64 {
    clock_monotonic_ns().saturating_sub(monotonic_base())
}

/// `CLOCK_MONOTONIC` at the first call: what `monotonic_ns` counts from,
/// and what turns its times into a timerfd's absolute ones.
fn monotonic_base() -> u64 {
    static BASE: OnceLock<u64> = OnceLock::new();
    *BASE.get_or_init(clock_monotonic_ns)
}

/// `CLOCK_MONOTONIC` (ns; 0 if it cannot be read, which POSIX systems
/// that have it never do).
fn clock_monotonic_ns() -> u64 {
    let mut time = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes only the timespec it is given, on this stack frame; a
    // vDSO call or a system call, no allocation, no Ruby.
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut time) } != 0 {
        return 0;
    }
    (time.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(time.tv_nsec as u64)
}

/// The CPU time this process has used (ns; 0 if the clock cannot be read):
/// with `monotonic_ns`, what a poll of the windows is told.
fn process_cpu_ns() -> u64 {
    let mut time = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes only the timespec it is given, which lives on this
    // stack frame; a system call, no allocation, no Ruby.
    let read = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut time) };
    if read != 0 {
        return 0;
    }
    (time.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(time.tv_nsec as u64)
}

/// The clocks for a poll of the windows, read now.
pub fn poll_time() -> PollTime {
    PollTime {
        wall_ns: monotonic_ns(),
        cpu_ns: process_cpu_ns(),
    }
}

/// A job not run this long after its trigger is triggered again, then
/// after waits that grow eightfold, up to the longest (see `run`). The
/// first catches a job flagged on a pool thread that went to wait; a job
/// still not run is mostly held by a GC or a long C call, which triggers
/// do not shorten (docs/performance.md).
const RETRIGGER_FIRST_NS: u64 = 200_000;
const RETRIGGER_GROWTH: u64 = 8;
const RETRIGGER_LONGEST_NS: u64 = 100_000_000;
/// Without a hook on threads taking the GVL (`watch_resumes`): the longest
/// wait while the job ran in the last `RECENTLY_RAN_NS`.
#[cfg(not(ruby_gte_3_3))]
const RETRIGGER_LONGEST_RECENT_NS: u64 = 1_600_000;
#[cfg(not(ruby_gte_3_3))]
const RECENTLY_RAN_NS: u64 = 100_000_000;

/// When (monotonic ns) the job last ran.
static LAST_RAN: AtomicU64 = AtomicU64::new(0);
/// A Ractor was created: threads that take the GVL may belong to it, and
/// must not run the job (see `on_resumed`).
#[cfg(ruby_gte_3_3)]
static RACTORS: AtomicBool = AtomicBool::new(false);
/// The trigger the thread calls (for `on_resumed`).
#[cfg(ruby_gte_3_3)]
static TRIGGER: OnceLock<fn()> = OnceLock::new();

/// When to trigger the job next (monotonic ns); `u64::MAX`: not needed.
static DEADLINE: AtomicU64 = AtomicU64::new(u64::MAX);
/// Until when (monotonic ns) the thread sleeps: the job wakes it only for
/// a deadline before that. (Waking costs a system call and two context
/// switches, and the job runs for every batch of samples, not only when
/// the thread asked.)
static SLEEPING_UNTIL: AtomicU64 = AtomicU64::new(0);
/// The thread sleeps until a check on a triggered job, not a deadline: a
/// job that runs meanwhile may move its wake-up later, to its deadline.
static SLEEPING_FOR_JOB: AtomicBool = AtomicBool::new(false);
/// The timerfd the thread sleeps on (-1: none, it parks).
static TIMER_FD: AtomicI32 = AtomicI32::new(-1);
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

/// Wakes the thread now.
fn wake() {
    let fd = TIMER_FD.load(Ordering::Acquire);
    if fd >= 0 && !arm(fd, 0) {
        give_up_timer_fd(fd);
    }
    let thread = THREAD.load(Ordering::Acquire);
    if !thread.is_null() {
        // SAFETY: a leaked Box, never freed; unparking a thread that is
        // gone (a forked child's copy) does nothing.
        unsafe { (*thread).unpark() };
    }
}

/// From the postponed job (GVL held), first: it ran, whatever it does next
/// (a stopped or paused collector asks for no next poll).
pub fn job_ran() {
    JOB_PENDING.store(false, Ordering::Release);
}

/// Before the process creates its first Ractor: from then on only the
/// timer thread triggers the job.
pub fn ractors_started() {
    #[cfg(ruby_gte_3_3)]
    RACTORS.store(true, Ordering::Release);
}

/// From the postponed job (GVL held): the job ran; call `trigger` (which
/// asks for it again) `in_ns` from now (None: only when asked again).
/// Starts the thread in this process if it has none.
pub fn schedule(in_ns: Option<u64>, trigger: fn()) {
    JOB_PENDING.store(false, Ordering::Release);
    let now = monotonic_ns();
    LAST_RAN.store(now, Ordering::Relaxed);
    let deadline = in_ns.map_or(u64::MAX, |d| now.saturating_add(d));
    // SeqCst, with the thread's store of SLEEPING_UNTIL and its second
    // load of DEADLINE: either it sees this deadline, or this sees how
    // long it sleeps.
    DEADLINE.store(deadline, Ordering::SeqCst);
    if STOP.load(Ordering::Relaxed) {
        return;
    }
    if OWNER.load(Ordering::Acquire) != std::process::id() {
        watch_resumes(trigger);
        start(trigger);
        wake();
        return;
    }
    let sleeping_until = SLEEPING_UNTIL.load(Ordering::SeqCst);
    if sleeping_until == 0 {
        // Awake: it reads the deadline before it sleeps again.
        return;
    }
    if deadline < sleeping_until {
        wake_at(sleeping_until, deadline);
    } else if deadline > sleeping_until
        && deadline != u64::MAX
        && SLEEPING_FOR_JOB.load(Ordering::SeqCst)
        && TIMER_FD.load(Ordering::Acquire) >= 0
    {
        // It would wake to check on this job, which has run: it sleeps on
        // to the deadline instead. (Only a timerfd can be moved later; a
        // parked thread wakes as planned.)
        wake_at(sleeping_until, deadline);
        // Unless it triggered the job again meanwhile and now sleeps until
        // a check on that: this may have moved that check later. Woken, it
        // decides again.
        if JOB_PENDING.load(Ordering::SeqCst) {
            wake();
        }
    }
}

/// Has the thread, asleep until `sleeping_until`, wake at `deadline`
/// (monotonic ns) instead: its timerfd moved, or, parked, woken now to
/// decide again.
fn wake_at(sleeping_until: u64, deadline: u64) {
    let fd = TIMER_FD.load(Ordering::Acquire);
    if fd < 0 {
        wake();
        return;
    }
    // (An absolute time: a job that ran late arms no later than it meant.)
    if !arm(fd, deadline) {
        give_up_timer_fd(fd);
        wake();
        return;
    }
    // What later jobs compare their deadlines with; unless the thread has
    // woken meanwhile (it then decides from DEADLINE, which holds this).
    SLEEPING_FOR_JOB.store(false, Ordering::SeqCst);
    let _ = SLEEPING_UNTIL.compare_exchange(
        sleeping_until,
        deadline,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
}

/// From the postponed job (GVL held), after every collector's `schedule`:
/// the job is wanted again `in_ns` from now at the latest (an earlier
/// deadline stands). Starts the thread in this process if it has none.
pub fn schedule_no_later(in_ns: u64, trigger: fn()) {
    if STOP.load(Ordering::Relaxed) {
        return;
    }
    let deadline = monotonic_ns().saturating_add(in_ns);
    if OWNER.load(Ordering::Acquire) != std::process::id() {
        // No thread here (a forked child's deadline is the parent's).
        DEADLINE.store(deadline, Ordering::SeqCst);
        watch_resumes(trigger);
        start(trigger);
        wake();
    } else if DEADLINE.fetch_min(deadline, Ordering::SeqCst) > deadline {
        // (SeqCst, as in `schedule`.)
        let sleeping_until = SLEEPING_UNTIL.load(Ordering::SeqCst);
        if deadline < sleeping_until {
            wake_at(sleeping_until, deadline);
        }
    }
}

/// Sleeps until `until` (monotonic ns) at the latest, or until a job moves
/// the wake-up (`wake_at`, `schedule`), unless the deadline changed from
/// `deadline` meanwhile. `for_job`: `until` is a check on a triggered job.
fn sleep_until(until: u64, deadline: u64, for_job: bool) {
    let now = monotonic_ns();
    if until <= now {
        return;
    }
    let mut fd = TIMER_FD.load(Ordering::Acquire);
    // Armed before the thread says how long it sleeps, so that a job that
    // reads it moves the wake-up after this (a job that read an earlier
    // sleep's may still re-arm it: see `schedule`).
    if fd >= 0 && !arm(fd, until) {
        fd = give_up_timer_fd(fd);
    }
    SLEEPING_FOR_JOB.store(for_job, Ordering::SeqCst);
    SLEEPING_UNTIL.store(until, Ordering::SeqCst);
    if DEADLINE.load(Ordering::SeqCst) == deadline {
        let waited = fd >= 0 && wait_for_timer(fd);
        if !waited {
            if fd >= 0 {
                give_up_timer_fd(fd);
            }
            std::thread::park_timeout(Duration::from_nanos(until - now));
        }
    }
    // Awake: a job's deadline must wake it again only if before now.
    SLEEPING_UNTIL.store(0, Ordering::SeqCst);
}

/// The timerfd `fd` failed (the application closed the descriptor, which
/// may now be another file of its own): the thread parks from now on, and
/// nothing here touches that number again. Returns -1.
fn give_up_timer_fd(fd: i32) -> i32 {
    let _ = TIMER_FD.compare_exchange(fd, -1, Ordering::AcqRel, Ordering::Acquire);
    -1
}

/// A timerfd for the thread to sleep on; -1 where there is none.
fn new_timer_fd() -> i32 {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: creates a file descriptor; no memory is passed.
        unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_CLOEXEC) }
    }
    #[cfg(not(target_os = "linux"))]
    {
        -1
    }
}

/// Sets the timerfd `fd` to expire once, at `at` (`monotonic_ns` time; a
/// time past expires at once). Any expiry not yet read is cleared. False
/// if `fd` is no timerfd (closed, or reused for another file): the call
/// then changed nothing.
fn arm(fd: i32, at: u64) -> bool {
    #[cfg(target_os = "linux")]
    {
        // (Never 0, which would disarm it: the base is CLOCK_MONOTONIC at
        // the first call, after boot.)
        let absolute = monotonic_base().saturating_add(at).max(1);
        let value = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: (absolute / 1_000_000_000) as libc::time_t,
                tv_nsec: (absolute % 1_000_000_000) as libc::c_long,
            },
        };
        // SAFETY: `fd` is the timerfd this module created (a stale one, in
        // a child before `start` replaced it, is never armed: `schedule`,
        // `schedule_no_later` and `stop_at_exit` check the owner first);
        // both structs live on this stack.
        unsafe {
            libc::timerfd_settime(fd, libc::TFD_TIMER_ABSTIME, &value, std::ptr::null_mut()) == 0
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (fd, at);
        false
    }
}

/// Blocks until the timerfd `fd` expires (or a signal interrupts: the
/// caller decides again either way). False if it cannot be read.
fn wait_for_timer(fd: i32) -> bool {
    let mut expirations = 0u64;
    // SAFETY: reads at most 8 bytes into a u64 on this stack frame. (`fd`
    // was a timerfd when it was just armed.)
    let read = unsafe {
        libc::read(
            fd,
            (&mut expirations as *mut u64).cast::<libc::c_void>(),
            std::mem::size_of::<u64>(),
        )
    };
    read == std::mem::size_of::<u64>() as isize
        || std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
}

fn start(trigger: fn()) {
    EXITED.store(false, Ordering::Release);
    OWNER.store(std::process::id(), Ordering::Release);
    // A forked child has its parent's timerfd, which is the same timer:
    // its own, before anything arms it.
    let inherited = TIMER_FD.swap(new_timer_fd(), Ordering::AcqRel);
    if inherited >= 0 {
        // SAFETY: closes this process's copy of a descriptor only this
        // module uses; the parent's stays open.
        unsafe { libc::close(inherited) };
    }
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
    // While a triggered job has not run: when to trigger it again, and
    // the wait after that.
    let mut retrigger_at = u64::MAX;
    let mut retrigger_wait = RETRIGGER_FIRST_NS;
    while !STOP.load(Ordering::Acquire) {
        let deadline = DEADLINE.load(Ordering::SeqCst);
        let now = monotonic_ns();
        if JOB_PENDING.load(Ordering::Acquire) {
            // Until the job has run (it wakes the thread with its next
            // deadline). Ruby flags the job on the thread that ran last:
            // if that one then waits (a pool thread back on its queue)
            // while others run, the job waits with it and windows go by
            // unhooked. So it is triggered again, for whichever thread runs
            // then, after waits that grow (a process idle in IO runs no
            // job: it is woken less and less often). On Ruby 3.3 and later
            // a thread that takes the GVL also triggers it (`on_resumed`).
            if now >= retrigger_at {
                if !STOP.load(Ordering::Acquire) {
                    trigger();
                }
                retrigger_wait =
                    (retrigger_wait * RETRIGGER_GROWTH).min(longest_retrigger_wait(now));
                retrigger_at = now.saturating_add(retrigger_wait);
            }
            sleep_until(retrigger_at, deadline, true);
        } else if deadline == u64::MAX {
            sleep_until(now.saturating_add(1_000_000_000), deadline, false);
        } else if now < deadline {
            sleep_until(deadline, deadline, false);
        } else {
            // Taken only if no job moved it meanwhile (else decide again): a
            // job that runs between this and the trigger then leaves its
            // deadline for after the pending job, rather than losing it to
            // a job that may wait on an idle thread with none retriggered.
            if DEADLINE
                .compare_exchange(deadline, u64::MAX, Ordering::SeqCst, Ordering::SeqCst)
                .is_err()
            {
                continue;
            }
            JOB_PENDING.store(true, Ordering::SeqCst);
            retrigger_wait = RETRIGGER_FIRST_NS;
            retrigger_at = now.saturating_add(retrigger_wait);
            if !STOP.load(Ordering::Acquire) {
                trigger();
            }
        }
    }
    EXITED.store(true, Ordering::Release);
}

/// The longest wait between two triggers of a job that has not run.
/// Without `watch_resumes`, a thread that takes the GVL while the job
/// waits on another is found only by triggering again: soon, while the
/// process has been running lately.
#[cfg(not(ruby_gte_3_3))]
fn longest_retrigger_wait(now: u64) -> u64 {
    if now.saturating_sub(LAST_RAN.load(Ordering::Relaxed)) < RECENTLY_RAN_NS {
        RETRIGGER_LONGEST_RECENT_NS
    } else {
        RETRIGGER_LONGEST_NS
    }
}

#[cfg(ruby_gte_3_3)]
fn longest_retrigger_wait(_now: u64) -> u64 {
    RETRIGGER_LONGEST_NS
}

/// Once per process (a forked child keeps it): a hook on every thread
/// taking the GVL that triggers the job while it is pending, so that the
/// thread about to run has it flagged (see `run`). Ruby 3.3 and later;
/// before, the timer's waits alone.
#[cfg(ruby_gte_3_3)]
fn watch_resumes(trigger: fn()) {
    use std::sync::Once;
    static ADDED: Once = Once::new();
    ADDED.call_once(|| {
        let _ = TRIGGER.set(trigger);
        // SAFETY: called with the GVL held (from the postponed job); the
        // callback is a static function that reads atomics and calls the
        // trigger (async-signal-safe: no allocation, no Ruby call).
        unsafe {
            rb_sys::rb_internal_thread_add_event_hook(
                Some(on_resumed),
                rb_sys::RUBY_INTERNAL_THREAD_EVENT_RESUMED,
                std::ptr::null_mut(),
            );
        }
    });
}

#[cfg(not(ruby_gte_3_3))]
fn watch_resumes(_trigger: fn()) {}

/// A thread took the GVL: Ruby has made it the current one, so a trigger
/// now flags the job on it (`get_valid_ec` in vm_trace.c). Runs on that
/// thread inside Ruby's scheduler: atomics and the trigger only.
#[cfg(ruby_gte_3_3)]
unsafe extern "C" fn on_resumed(
    _event: rb_sys::rb_event_flag_t,
    _data: *const rb_sys::rb_internal_thread_event_data_t,
    _user_data: *mut std::ffi::c_void,
) {
    // (A thread of another Ractor would run the job beside the main
    // Ractor's, outside its GVL.)
    if JOB_PENDING.load(Ordering::Acquire)
        && !STOP.load(Ordering::Relaxed)
        && !RACTORS.load(Ordering::Acquire)
    {
        if let Some(trigger) = TRIGGER.get() {
            trigger();
        }
    }
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

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::{arm, monotonic_ns, new_timer_fd, wait_for_timer};
    use std::time::{Duration, Instant};

    const MS: u64 = 1_000_000;

    /// Waits on a new timerfd armed `first_ms` ahead, moved to `moved_ms`
    /// (from the arming) by another thread 10 ms in; how long the wait took.
    fn wait_moved(first_ms: u64, moved_ms: u64) -> Duration {
        let fd = new_timer_fd();
        assert!(fd >= 0, "timerfd_create failed");
        let began = Instant::now();
        let at = monotonic_ns();
        arm(fd, at + first_ms * MS);
        let mover = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(10));
            arm(fd, at + moved_ms * MS);
        });
        wait_for_timer(fd);
        let waited = began.elapsed();
        mover.join().expect("the mover");
        // SAFETY: the descriptor this test created, no longer used.
        unsafe { libc::close(fd) };
        waited
    }

    /// A job moves the sleeping thread's wake-up without waking it: earlier
    /// (a nearer deadline) and later (a check on a job that has run). A
    /// timer never fires early; the upper bounds leave a busy machine
    /// a second or more.
    #[test]
    #[cfg_attr(miri, ignore = "system calls")]
    fn a_sleeping_thread_wakes_when_its_timer_was_moved_to() {
        let earlier = wait_moved(5_000, 30);
        assert!(earlier >= Duration::from_millis(30), "{earlier:?}");
        assert!(earlier < Duration::from_millis(4_000), "{earlier:?}");
        let later = wait_moved(1_000, 1_500);
        assert!(later >= Duration::from_millis(1_500), "{later:?}");
    }

    /// A descriptor the application closed (or reused) is never armed or
    /// read as the timer: the thread then parks instead.
    #[test]
    #[cfg_attr(miri, ignore = "system calls")]
    fn a_closed_descriptor_is_no_timer() {
        let fd = new_timer_fd();
        assert!(fd >= 0, "timerfd_create failed");
        // SAFETY: the descriptor this test created.
        unsafe { libc::close(fd) };
        assert!(!arm(fd, 0));
        assert!(!wait_for_timer(fd));
        // A pipe in its place: not a timerfd, and its bytes are not read.
        let mut pipe = [0i32; 2];
        // SAFETY: writes two descriptors into the array on this stack.
        assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0);
        assert!(!arm(pipe[0], 0));
        // SAFETY: the pipe this test made.
        unsafe {
            libc::close(pipe[0]);
            libc::close(pipe[1]);
        }
    }

    /// Arming clears an expiry not yet read: the next wait is for the new
    /// time, not returned at once.
    #[test]
    #[cfg_attr(miri, ignore = "system calls")]
    fn an_expiry_not_read_does_not_end_the_next_wait() {
        let fd = new_timer_fd();
        assert!(fd >= 0, "timerfd_create failed");
        arm(fd, 0);
        std::thread::sleep(Duration::from_millis(5));
        let began = Instant::now();
        arm(fd, monotonic_ns() + 50 * MS);
        wait_for_timer(fd);
        assert!(
            began.elapsed() >= Duration::from_millis(50),
            "{:?}",
            began.elapsed()
        );
        // SAFETY: the descriptor this test created.
        unsafe { libc::close(fd) };
    }
}
