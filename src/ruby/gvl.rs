//! The GVL: letting other Ruby threads run during a long flush, and
//! running pure Rust work (building the profile) with the GVL released.

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};

use rb_sys::{rb_thread_call_without_gvl, rb_thread_schedule, Qnil, VALUE};

use super::errors::{protect, RbError, RbResult};

/// This thread's pthread_self(), to tell the flushing thread apart.
pub fn current_thread() -> usize {
    // SAFETY: pthread_self has no preconditions.
    unsafe { libc::pthread_self() as usize }
}

/// Lets other Ruby threads run. Interrupts (Thread#raise, signal traps) can
/// raise here, hence protect.
pub fn yield_to_other_threads() -> RbResult<()> {
    protect(|| {
        // SAFETY: called with the GVL held, outside any lock of ours.
        unsafe { rb_thread_schedule() };
        Qnil as VALUE
    })?;
    Ok(())
}

/// Runs `work` with the GVL released. `work` must not touch Ruby.
pub fn without_gvl<T, F: FnOnce() -> T>(work: F) -> RbResult<T> {
    struct Job<T, F> {
        work: Option<F>,
        result: Option<std::thread::Result<T>>,
    }

    unsafe extern "C" fn run<T, F: FnOnce() -> T>(data: *mut c_void) -> *mut c_void {
        // SAFETY: `data` is the Job below, alive for the whole call.
        let job = unsafe { &mut *(data as *mut Job<T, F>) };
        if let Some(work) = job.work.take() {
            job.result = Some(catch_unwind(AssertUnwindSafe(work)));
        }
        std::ptr::null_mut()
    }

    let mut job = Job {
        work: Some(work),
        result: None,
    };
    let job_ptr = &mut job as *mut Job<T, F> as *mut c_void;
    // Re-taking the GVL checks interrupts, which may raise: protect.
    protect(|| {
        // SAFETY: `run` never calls into Ruby and catches panics; no unblock
        // function is needed because the work is short and CPU-bound.
        unsafe {
            rb_thread_call_without_gvl(Some(run::<T, F>), job_ptr, None, std::ptr::null_mut())
        };
        Qnil as VALUE
    })?;
    match job.result {
        Some(Ok(value)) => Ok(value),
        Some(Err(_)) => Err(RbError::runtime(
            "memprofiler_pprof_rs internal error while building the profile",
        )),
        None => Err(RbError::runtime("profile was not built")),
    }
}
