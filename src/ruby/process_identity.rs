//! This process as its profiles name it (pprof/process_comment.rs): its
//! pid, when it started (for a forked child: when it was forked), its
//! parent if forked, and Ruby's $0 at the flush.

use std::ffi::CStr;
use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use rb_sys::rb_gv_get;

use super::convert::rust_string;
use super::errors::{protect, RbResult};
use pprof::process_comment::ProcessIdentity;

static STARTED_MILLIS: AtomicI64 = AtomicI64::new(0);
/// The parent's pid in a forked child; 0 otherwise.
static FORKED_FROM: AtomicU32 = AtomicU32::new(0);

fn now_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// At extension load: the process's start is taken as now (the extension
/// loads at boot in the set-ups it documents).
pub fn init() {
    STARTED_MILLIS.store(now_millis(), Ordering::Relaxed);
}

/// The forking process's pid, taken before the fork: in the child,
/// getppid() may already name init (Process.daemon's parent exits at once).
static FORKING_PID: AtomicU32 = AtomicU32::new(0);

/// Before a fork (from the pthread_atfork prepare handler).
pub fn before_fork() {
    FORKING_PID.store(std::process::id(), Ordering::Relaxed);
}

/// In a forked child (from the pthread_atfork child handler: reads the
/// clock and an atomic, both async-signal-safe).
pub fn after_fork_in_child() {
    STARTED_MILLIS.store(now_millis(), Ordering::Relaxed);
    FORKED_FROM.store(FORKING_PID.load(Ordering::Relaxed), Ordering::Relaxed);
}

/// This process now. Reads $0 (GVL held, not in a hook).
pub fn current() -> RbResult<ProcessIdentity> {
    const NAME: &CStr = c"$0";
    // SAFETY: reads a global variable by its static name; under protect.
    let program = protect(|| unsafe { rb_gv_get(NAME.as_ptr()) })?;
    let forked_from = FORKED_FROM.load(Ordering::Relaxed);
    Ok(ProcessIdentity {
        pid: std::process::id(),
        started_millis: STARTED_MILLIS.load(Ordering::Relaxed),
        forked_from: (forked_from != 0).then_some(forked_from),
        program: rust_string(program).unwrap_or_default(),
    })
}
