//! The collectors whose hooks are enabled, process-wide. Used to
//! - measure freshly sampled objects from one postponed job (Ruby runs a
//!   postponed job at its next safe point, when new objects are filled in);
//! - switch every hook off at exit, before Ruby frees objects wholesale;
//! - take every sampler lock around fork(), so a child never inherits a lock
//!   held by a thread it does not have;
//! - pause allocation sampling while non-main Ractors exist.
//!
//! It knows a collector only through `Registered`, so it depends on nothing
//! else in the binding layer (the collector registers itself here).

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{LazyLock, Once};

use super::window_timer;
use sampler_lock::SamplerLock;

/// What the registry asks of a collector. Every method runs with the GVL
/// held except the fork ones, which run inside fork() and only take,
/// release or re-initialise locks.
pub trait Registered {
    /// The postponed job: measures the samples taken since the last call
    /// and polls the windows.
    fn measure_pending(&self);
    /// The postponed job, after every collector's `measure_pending`:
    /// releases a chunk of what flushes left (asking for the job again
    /// after the windows' polls did).
    fn tidy_after_flush(&self);
    /// Switches every hook off before Ruby's final sweep (at exit).
    fn disable_hooks_at_exit(&self);
    /// Pauses sampling while non-main Ractors exist.
    fn pause_for_ractors(&self);
    /// Takes the sampler lock before fork().
    fn lock_for_fork(&self);
    /// Releases it in the parent after fork().
    fn unlock_after_fork(&self);
    /// Re-initialises it in the child (its holder thread is gone).
    fn reinit_lock_in_child(&self);
    /// Starts the child's own interval (after every lock is usable again).
    fn reset_after_fork_in_child(&self);
}

/// A registered collector. Its Box does not move, and it removes itself
/// before it is dropped, so every pointer in the registry is valid.
#[derive(Clone, Copy)]
struct Entry(*const dyn Registered);

// SAFETY: an entry is only dereferenced with the GVL held, or inside fork()
// on the forking thread while every other thread waits for the GVL, so no
// two threads use a collector at once (Collector is not Sync: a Cell).
unsafe impl Send for Entry {}

impl Entry {
    fn is(&self, collector: &dyn Registered) -> bool {
        std::ptr::addr_eq(self.0, collector as *const dyn Registered)
    }
}

/// The registered collectors. A SamplerLock (not std's Mutex) so the fork
/// handlers can hold it.
static ACTIVE: LazyLock<SamplerLock<Vec<Entry>>> = LazyLock::new(|| SamplerLock::new(Vec::new()));

fn with_active<R>(f: impl FnOnce(&mut Vec<Entry>) -> R) -> R {
    match ACTIVE.lock() {
        Ok(mut guard) => f(&mut guard),
        // Only this module takes the lock, never while holding it.
        Err(_) => f(&mut Vec::new()),
    }
}

/// Registers `collector` (once). It must call `remove` before it is dropped.
pub fn add(collector: &(dyn Registered + 'static)) {
    with_active(|active| {
        if !active.iter().any(|e| e.is(collector)) {
            active.push(Entry(collector));
        }
    });
}

pub fn remove(collector: &(dyn Registered + 'static)) {
    with_active(|active| active.retain(|e| !e.is(collector)));
}

fn for_each(mut f: impl FnMut(&dyn Registered)) {
    let collectors = with_active(|active| active.clone());
    for entry in collectors {
        // SAFETY: collectors unregister before being dropped, and this runs
        // with the GVL held, so none can be dropped while we use it.
        f(unsafe { &*entry.0 });
    }
}

/// Asks Ruby to run `measure_pending_job` at its next safe point. Safe to
/// call from the NEWOBJ hook: it allocates nothing and never blocks.
#[inline]
pub fn request_measurement() {
    postponed::trigger();
}

unsafe extern "C" fn measure_pending_job(_data: *mut c_void) {
    // A panic must not unwind into Ruby; nothing useful can be reported from
    // here, so it is counted by the collector that caused it.
    window_timer::job_ran();
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let collectors = with_active(|active| active.clone());
        for step in [
            <dyn Registered>::measure_pending,
            <dyn Registered>::tidy_after_flush,
        ] {
            for entry in &collectors {
                // SAFETY: as in `for_each`.
                step(unsafe { &*entry.0 });
            }
        }
    }));
}

/// Stops every collector's hooks: registered with rb_set_end_proc, so it runs
/// before Ruby's final object sweep frees the TracePoint objects.
pub unsafe extern "C" fn disable_all_at_exit(_data: rb_sys::VALUE) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        for_each(|collector| collector.disable_hooks_at_exit());
        // No job may be asked for once Ruby tears down.
        window_timer::stop_at_exit();
    }));
}

#[cfg(not(ruby_gte_3_3))]
mod postponed {
    use rb_sys::rb_postponed_job_register_one;

    pub fn init() {}

    #[inline]
    pub fn trigger() {
        // SAFETY: async-signal-safe, allocation-free registration of a job
        // with a static function; "one" makes repeated calls cheap no-ops.
        unsafe {
            rb_postponed_job_register_one(
                0,
                Some(super::measure_pending_job),
                std::ptr::null_mut(),
            );
        }
    }
}

#[cfg(ruby_gte_3_3)]
mod postponed {
    use std::sync::atomic::{AtomicU32, Ordering};

    use rb_sys::{rb_postponed_job_preregister, rb_postponed_job_trigger};

    // Ruby 3.3 replaced register_one with preregister (once) + trigger.
    const INVALID: u32 = u32::MAX;
    static HANDLE: AtomicU32 = AtomicU32::new(INVALID);

    pub fn init() {
        // SAFETY: called once from Init with the GVL held.
        let handle = unsafe {
            rb_postponed_job_preregister(0, Some(super::measure_pending_job), std::ptr::null_mut())
        };
        HANDLE.store(handle as u32, Ordering::Relaxed);
    }

    #[inline]
    pub fn trigger() {
        let handle = HANDLE.load(Ordering::Relaxed);
        if handle != INVALID {
            // SAFETY: a handle returned by rb_postponed_job_preregister;
            // triggering is async-signal-safe.
            unsafe { rb_postponed_job_trigger(handle as _) };
        }
    }
}

/// Pauses allocation sampling on every collector (see `Collector::pause_for_ractors`).
pub fn pause_all_for_ractors() {
    window_timer::ractors_started();
    for_each(|collector| collector.pause_for_ractors());
}

// ----- fork ---------------------------------------------------------------

static FORK_HANDLERS: Once = Once::new();

/// Each registered collector, for the fork handlers, which hold the registry
/// lock without a guard between `before_fork` and the after-fork handlers.
///
/// # Safety
/// The calling thread must hold the registry lock (taken by `before_fork`).
unsafe fn collectors_while_forking() -> impl DoubleEndedIterator<Item = &'static dyn Registered> {
    // SAFETY: the registry lock is held by this thread, so the list cannot
    // change; every entry is a live collector (see `Entry`).
    let collectors: &'static Vec<Entry> = unsafe { &*ACTIVE.data_ptr() };
    collectors.iter().map(|entry| {
        // SAFETY: as above.
        unsafe { &*entry.0 }
    })
}

unsafe extern "C" fn before_fork() {
    super::process_identity::before_fork();
    // Registry first, then each collector's lock; released in reverse.
    ACTIVE.lock_for_fork();
    // SAFETY: the registry lock was just taken by this thread.
    unsafe { collectors_while_forking() }.for_each(|c| c.lock_for_fork());
}

unsafe extern "C" fn after_fork_in_parent() {
    // SAFETY: `before_fork` ran on this thread and still holds the registry.
    unsafe { collectors_while_forking() }
        .rev()
        .for_each(|c| c.unlock_after_fork());
    ACTIVE.unlock_after_fork();
}

unsafe extern "C" fn after_fork_in_child() {
    // SAFETY (both calls): as in the parent; the child has only this thread.
    // The child's thread may have another pthread_self() than the parent's
    // forking thread (see SamplerLock::reinit_in_child): locks are freed.
    unsafe { collectors_while_forking() }
        .rev()
        .for_each(|c| c.reinit_lock_in_child());
    // A flush another thread was running will never finish in the child.
    unsafe { collectors_while_forking() }.for_each(|c| c.reset_after_fork_in_child());
    ACTIVE.reinit_in_child();
    super::process_identity::after_fork_in_child();
}

pub fn init() {
    postponed::init();
    FORK_HANDLERS.call_once(|| {
        // SAFETY: plain function pointers that only take, release and
        // re-initialise locks.
        unsafe {
            libc::pthread_atfork(
                Some(before_fork),
                Some(after_fork_in_parent),
                Some(after_fork_in_child),
            )
        };
    });
}
