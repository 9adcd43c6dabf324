//! The GVL: letting other Ruby threads run during a long flush, and
//! running pure Rust work (building the profile) with the GVL released.

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

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
        Some(Err(_)) => Err(RbError::internal(
            "memprofiler_pprof_rs internal error while building the profile",
        )),
        None => Err(RbError::internal("profile was not built")),
    }
}

/// The longest the GVL was held between two points where other threads
/// could run: how long a flush may have stalled the rest of the program.
/// Every yield and every stretch without the GVL goes through it.
pub struct GvlHolds {
    since: Instant,
    longest: Duration,
}

impl GvlHolds {
    /// The GVL held from now.
    pub fn new() -> Self {
        GvlHolds {
            since: Instant::now(),
            longest: Duration::ZERO,
        }
    }

    fn close(&mut self) {
        self.longest = self.longest.max(self.since.elapsed());
    }

    /// `yield_to_other_threads`, ending a hold.
    pub fn yield_now(&mut self) -> RbResult<()> {
        self.close();
        let result = yield_to_other_threads();
        self.since = Instant::now();
        result
    }

    /// `without_gvl`, ending a hold.
    pub fn without_gvl<T, F: FnOnce() -> T>(&mut self, work: F) -> RbResult<T> {
        self.close();
        let result = without_gvl(work);
        self.since = Instant::now();
        result
    }

    /// Lets other threads run if the GVL has been held for `long` (the
    /// steps that check it are much shorter).
    pub fn yield_if_held(&mut self, long: Duration) -> RbResult<()> {
        if self.since.elapsed() >= long {
            self.yield_now()
        } else {
            Ok(())
        }
    }

    /// The longest hold, the one under way included.
    pub fn longest(&mut self) -> Duration {
        self.close();
        self.longest
    }
}
