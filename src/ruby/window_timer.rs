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
//! on every Ruby by this thread after waits that double from 0.2 ms (up to
//! 1.6 ms while the job ran in the last 0.1 s, before 3.3). A process
//! idle in IO or sleep runs no job: its wake-ups thin out to ten a second.
//!
//! It sleeps on an alarm (ruby/window_alarm.rs) that the job sets to its
//! next deadline whenever that changes, so a job never wakes the thread
//! only for it to sleep again. At exit it is stopped, and waited for,
//! before Ruby tears down what the trigger writes to. In a forked child
//! (where it does not exist) the next job starts another.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};
#[cfg(ruby_gte_3_3)]
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::monotonic_clock::monotonic_ns;
use super::window_alarm::Alarm;

/// A job not run this long after its trigger is triggered again, then
/// after waits that double, up to the longest (see `run`).
const RETRIGGER_FIRST_NS: u64 = 200_000;
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
/// Triggered, and the job has not run since.
static JOB_PENDING: AtomicBool = AtomicBool::new(false);
static STOP: AtomicBool = AtomicBool::new(false);
/// The alarm of this process's thread, if any (leaked: one per process
/// that profiles with windows).
static ALARM: AtomicPtr<Alarm> = AtomicPtr::new(std::ptr::null_mut());
/// The process the thread runs in (after fork, the child has none).
static OWNER: AtomicU32 = AtomicU32::new(0);
/// The thread's loop has ended.
static EXITED: AtomicBool = AtomicBool::new(true);
/// The longest the thread sleeps with nothing to do.
const IDLE_NS: u64 = 1_000_000_000;

fn alarm() -> Option<&'static Alarm> {
    let alarm = ALARM.load(Ordering::Acquire);
    // SAFETY: null or a leaked Box, never freed.
    unsafe { alarm.as_ref() }
}

/// From the job (or a collector starting), after it changed `DEADLINE`:
/// the thread wakes for it (no job is pending then, so the deadline is all
/// the thread waits for). With the
/// thread's own `set` and its second look at the deadline in `run`:
/// either the thread sees this deadline, or this `set` comes after its.
fn set_alarm(deadline: u64) {
    if deadline == u64::MAX {
        // Nothing to wake for: the thread finds that out at its next wake.
        return;
    }
    if let Some(alarm) = alarm() {
        alarm.set(deadline);
    }
}

/// From the postponed job (GVL held), first: it ran, whatever it does next
/// (a stopped or paused collector asks for no next poll).
pub fn job_ran() {
    JOB_PENDING.store(false, Ordering::SeqCst);
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
    JOB_PENDING.store(false, Ordering::SeqCst);
    let now = monotonic_ns();
    LAST_RAN.store(now, Ordering::Relaxed);
    let deadline = in_ns.map_or(u64::MAX, |d| now.saturating_add(d));
    // SeqCst, with the thread's loads in `run` (see `set_alarm`).
    DEADLINE.store(deadline, Ordering::SeqCst);
    if STOP.load(Ordering::Relaxed) {
        return;
    }
    if OWNER.load(Ordering::Acquire) != std::process::id() {
        watch_resumes(trigger);
        start(trigger);
    } else {
        set_alarm(deadline);
    }
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
    } else if DEADLINE.fetch_min(deadline, Ordering::SeqCst) > deadline {
        set_alarm(deadline);
    }
}

fn start(trigger: fn()) {
    // Once per process, whether or not a thread can be had.
    OWNER.store(std::process::id(), Ordering::Release);
    let Some(alarm) = Alarm::new() else {
        // No timer: polls come from GCs only (windows still unbiased,
        // just armed less often).
        return;
    };
    let alarm: &'static Alarm = Box::leak(Box::new(alarm));
    ALARM.store(alarm as *const Alarm as *mut Alarm, Ordering::Release);
    EXITED.store(false, Ordering::Release);
    let spawned = std::thread::Builder::new()
        .name("memprofiler-windows".into())
        .stack_size(64 * 1024)
        .spawn(move || run(trigger, alarm));
    if spawned.is_err() {
        // No thread: as without a timer.
        EXITED.store(true, Ordering::Release);
    }
}

/// In a forked child, at once (pthread_atfork: async-signal-safe calls
/// only): the parent's alarm is not this process's to set, and its
/// descriptor is closed before the child's code can reuse its number.
pub fn after_fork_in_child() {
    let inherited = ALARM.swap(std::ptr::null_mut(), Ordering::AcqRel);
    // SAFETY: null or the parent's leaked alarm, which no thread of the
    // child waits on and nothing reaches any more.
    if let Some(inherited) = unsafe { inherited.as_ref() } {
        inherited.forget();
    }
}

fn run(trigger: fn(), alarm: &'static Alarm) {
    alarm.bind();
    // While a triggered job has not run: when to trigger it again, and
    // the wait after that.
    let mut retrigger_at = u64::MAX;
    let mut retrigger_wait = RETRIGGER_FIRST_NS;
    while !STOP.load(Ordering::Acquire) {
        let mut deadline = DEADLINE.load(Ordering::SeqCst);
        let mut pending = JOB_PENDING.load(Ordering::SeqCst);
        let now = monotonic_ns();
        if !pending && deadline <= now {
            // Taken only if no job moved it meanwhile (else decide again):
            // a job between this and the trigger below then leaves its
            // deadline for after the pending job has run.
            if DEADLINE
                .compare_exchange(deadline, u64::MAX, Ordering::SeqCst, Ordering::SeqCst)
                .is_err()
            {
                continue;
            }
            pending = true;
            deadline = u64::MAX;
            JOB_PENDING.store(true, Ordering::SeqCst);
            retrigger_wait = RETRIGGER_FIRST_NS;
            retrigger_at = now.saturating_add(retrigger_wait);
            if !STOP.load(Ordering::Acquire) {
                trigger();
            }
        } else if pending && now >= retrigger_at {
            // The job has not run. Ruby flags it on the thread that ran
            // last: if that one then waits (a pool thread back on its
            // queue) while others run, the job waits with it and windows
            // go by unhooked. So it is triggered again, for whichever
            // thread runs then, after waits that double (a process idle in
            // IO runs no job: it is woken less and less often). On Ruby 3.3
            // and later a thread that takes the GVL also triggers it
            // (`on_resumed`).
            if !STOP.load(Ordering::Acquire) {
                trigger();
            }
            retrigger_wait = (retrigger_wait * 2).min(longest_retrigger_wait(now));
            retrigger_at = now.saturating_add(retrigger_wait);
        }
        let wake_at = if pending {
            retrigger_at
        } else if deadline == u64::MAX {
            now.saturating_add(IDLE_NS)
        } else {
            deadline
        };
        alarm.set(wake_at);
        // The job may have run, or moved the deadline, since the loads
        // above, and its alarm been overwritten by this one: then decide
        // again (see `set_alarm`).
        if DEADLINE.load(Ordering::SeqCst) == deadline
            && JOB_PENDING.load(Ordering::SeqCst) == pending
        {
            alarm.wait();
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
    let Some(alarm) = alarm() else {
        return;
    };
    let began = Instant::now();
    while !EXITED.load(Ordering::Acquire) && began.elapsed() < Duration::from_millis(200) {
        alarm.set(0);
        std::thread::sleep(Duration::from_micros(200));
    }
}
