//! The collectors whose hooks are enabled, process-wide. Used to
//! - measure freshly sampled objects from one postponed job (Ruby runs a
//!   postponed job at its next safe point, when new objects are filled in);
//! - switch every hook off at exit, before Ruby frees objects wholesale;
//! - take every sampler lock around fork(), so a child never inherits a lock
//!   held by a thread it does not have;
//! - pause allocation sampling while non-main Ractors exist.

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{LazyLock, Once};

use super::collector::Collector;
use crate::sampler::lock::SamplerLock;

/// Addresses of `Collector`s (their Box, which does not move). A collector
/// removes itself before it is dropped, so every address here is valid.
/// A SamplerLock (not std's Mutex) so the fork handlers can hold it.
static ACTIVE: LazyLock<SamplerLock<Vec<usize>>> = LazyLock::new(|| SamplerLock::new(Vec::new()));

fn with_active<R>(f: impl FnOnce(&mut Vec<usize>) -> R) -> R {
    match ACTIVE.lock() {
        Ok(mut guard) => f(&mut guard),
        // Only this module takes the lock, never while holding it.
        Err(_) => f(&mut Vec::new()),
    }
}

pub fn add(collector: &Collector) {
    let address = collector as *const Collector as usize;
    with_active(|active| {
        if !active.contains(&address) {
            active.push(address);
        }
    });
}

pub fn remove(collector: &Collector) {
    let address = collector as *const Collector as usize;
    with_active(|active| active.retain(|&a| a != address));
}

fn for_each(mut f: impl FnMut(&Collector)) {
    let collectors = with_active(|active| active.clone());
    for address in collectors {
        // SAFETY: collectors unregister before being dropped, and this runs
        // with the GVL held, so none can be dropped while we use it.
        f(unsafe { &*(address as *const Collector) });
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
    let _ = catch_unwind(AssertUnwindSafe(|| {
        for_each(|collector| collector.measure_pending());
    }));
}

/// Stops every collector's hooks: registered with rb_set_end_proc, so it runs
/// before Ruby's final object sweep frees the TracePoint objects.
pub unsafe extern "C" fn disable_all_at_exit(_data: rb_sys::VALUE) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        for_each(|collector| collector.disable_hooks_at_exit());
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
    for_each(|collector| collector.pause_for_ractors());
}

// ----- fork ---------------------------------------------------------------

static FORK_HANDLERS: Once = Once::new();

/// Each registered collector, for the fork handlers, which hold the registry
/// lock without a guard between `before_fork` and the after-fork handlers.
///
/// # Safety
/// The calling thread must hold the registry lock (taken by `before_fork`).
unsafe fn collectors_while_forking() -> impl DoubleEndedIterator<Item = &'static Collector> {
    // SAFETY: the registry lock is held by this thread, so the list cannot
    // change; every address is a live collector (see ACTIVE).
    let collectors: &'static Vec<usize> = unsafe { &*ACTIVE.data_ptr() };
    collectors.iter().map(|&address| {
        // SAFETY: as above.
        unsafe { &*(address as *const Collector) }
    })
}

unsafe extern "C" fn before_fork() {
    // Registry first, then each collector's lock; released in reverse.
    ACTIVE.lock_for_fork();
    // SAFETY: the registry lock was just taken by this thread.
    unsafe { collectors_while_forking() }.for_each(|c| c.sampler.lock_for_fork());
}

unsafe extern "C" fn after_fork_in_parent() {
    // SAFETY: `before_fork` ran on this thread and still holds the registry.
    unsafe { collectors_while_forking() }
        .rev()
        .for_each(|c| c.sampler.unlock_after_fork());
    ACTIVE.unlock_after_fork();
}

unsafe extern "C" fn after_fork_in_child() {
    // SAFETY (both calls): as in the parent; the child has only this thread.
    // The child's thread may have another pthread_self() than the parent's
    // forking thread (see SamplerLock::reinit_in_child): locks are freed.
    unsafe { collectors_while_forking() }
        .rev()
        .for_each(|c| c.sampler.reinit_in_child());
    // A flush another thread was running will never finish in the child.
    unsafe { collectors_while_forking() }.for_each(|c| c.reset_after_fork_in_child());
    ACTIVE.reinit_in_child();
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
