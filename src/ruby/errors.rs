//! Crossing between Rust and Ruby safely.
//!
//! - Ruby raises by `longjmp`, which must never skip a Rust frame that owns
//!   something with a destructor. Every Ruby call that can raise runs inside
//!   `protect` (rb_protect); a failure comes back as `RbError` and is raised
//!   again only by `method_entry`, after all Rust values are dropped.
//! - A Rust panic must never unwind into C. Every function Ruby calls goes
//!   through `method_entry` (methods) or `catch_unwind` (hooks, GC callbacks).

use std::any::Any;
use std::ffi::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};

use std::sync::atomic::{AtomicUsize, Ordering};

use rb_sys::{
    rb_define_class_under, rb_define_module_under, rb_eArgError, rb_eRuntimeError, rb_eTypeError,
    rb_errinfo, rb_exc_new, rb_exc_new_cstr, rb_exc_raise, rb_include_module, rb_jump_tag,
    rb_protect, rb_set_errinfo, Qnil, VALUE,
};

/// Ruby's tag for a raised exception (TAG_RAISE in eval_intern.h).
const TAG_RAISE: c_int = 6;

/// A failure to report to Ruby once Rust has cleaned up.
#[derive(Debug)]
pub enum RbError {
    /// A Ruby exception caught by `protect`, to raise again.
    Exception(VALUE),
    /// A non-exception jump (throw, thread kill) caught by `protect`.
    Jump(c_int),
    /// An error found in Rust, raised as `class` with this message.
    New(ErrorClass, String),
}

#[derive(Debug, Clone, Copy)]
pub enum ErrorClass {
    Argument,
    Type,
    /// `MemprofilerPprof::StateError`: a call the object's state refuses.
    State,
    /// `MemprofilerPprof::InternalError`: a bug of the gem's.
    Internal,
}

/// `MemprofilerPprof::StateError` and `InternalError` (both RuntimeErrors
/// that include `MemprofilerPprof::Error`), set once by `define_errors`.
/// Classes defined by `rb_define_class_under` are registered with the GC
/// for good and pinned, so keeping their VALUEs here is safe.
static STATE_ERROR: AtomicUsize = AtomicUsize::new(0);
static INTERNAL_ERROR: AtomicUsize = AtomicUsize::new(0);

/// Defines `MemprofilerPprof::Error` (a module every exception the gem
/// raises on its own account includes, so one `rescue` catches them all
/// while each keeps its Ruby superclass) and the two RuntimeErrors the
/// native code raises.
///
/// # Safety
/// GVL held, at extension load, under protect (defining may raise).
pub unsafe fn define_errors(module: VALUE) {
    // SAFETY: the caller holds the GVL; the names are static C strings.
    unsafe {
        let error = rb_define_module_under(module, c"Error".as_ptr());
        for (name, slot) in [
            (c"StateError", &STATE_ERROR),
            (c"InternalError", &INTERNAL_ERROR),
        ] {
            let class = rb_define_class_under(module, name.as_ptr(), rb_eRuntimeError);
            rb_include_module(class, error);
            slot.store(class as usize, Ordering::Relaxed);
        }
    }
}

fn defined_or_runtime(slot: &AtomicUsize) -> VALUE {
    match slot.load(Ordering::Relaxed) {
        // SAFETY: reads a class global Ruby sets up before any extension.
        0 => unsafe { rb_eRuntimeError },
        class => class as VALUE,
    }
}

impl RbError {
    pub fn argument(message: impl Into<String>) -> Self {
        RbError::New(ErrorClass::Argument, message.into())
    }

    pub fn type_error(message: impl Into<String>) -> Self {
        RbError::New(ErrorClass::Type, message.into())
    }

    /// A call the object's current state refuses (StateError).
    pub fn state(message: impl Into<String>) -> Self {
        RbError::New(ErrorClass::State, message.into())
    }

    /// A bug of the gem's (InternalError).
    pub fn internal(message: impl Into<String>) -> Self {
        RbError::New(ErrorClass::Internal, message.into())
    }

    fn from_panic(payload: Box<dyn Any + Send>) -> Self {
        let detail = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".to_string());
        let place = PANIC_PLACE.with(|place| place.borrow_mut().take());
        let at = place.map(|p| format!(" (at {p})")).unwrap_or_default();
        RbError::internal(format!(
            "memprofiler_pprof_rs internal error (please report): {detail}{at}"
        ))
    }
}

thread_local! {
    /// Where the last panic on this thread happened, for `from_panic`.
    static PANIC_PLACE: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Panics are caught at every entry point and become Ruby exceptions (or
/// counted internal errors in hooks); Rust's default hook would also print
/// a multi-line report on the host program's stderr. This one only notes
/// where the panic happened, for the exception's message.
pub fn install_quiet_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        if let Some(location) = info.location() {
            let place = format!("{}:{}", location.file(), location.line());
            // try_with: during thread teardown the slot may be gone.
            let _ = PANIC_PLACE.try_with(|slot| {
                if let Ok(mut slot) = slot.try_borrow_mut() {
                    *slot = Some(place);
                }
            });
        }
    }));
}

pub type RbResult<T> = Result<T, RbError>;

/// Runs `f` under rb_protect. `f` must own nothing with a destructor across
/// the Ruby calls it makes (it may return a VALUE, which the conservative
/// stack scan keeps alive).
pub fn protect<F: FnOnce() -> VALUE>(f: F) -> RbResult<VALUE> {
    struct Call<F> {
        f: Option<F>,
        panic: Option<Box<dyn Any + Send>>,
    }

    unsafe extern "C" fn trampoline<F: FnOnce() -> VALUE>(data: VALUE) -> VALUE {
        // SAFETY: `data` is the address of the `Call<F>` below, alive for the
        // whole rb_protect call.
        let call = unsafe { &mut *(data as *mut Call<F>) };
        let Some(f) = call.f.take() else {
            return Qnil as VALUE;
        };
        match catch_unwind(AssertUnwindSafe(f)) {
            Ok(value) => value,
            Err(payload) => {
                call.panic = Some(payload);
                Qnil as VALUE
            }
        }
    }

    let mut call = Call {
        f: Some(f),
        panic: None,
    };
    let mut state: c_int = 0;
    // SAFETY: the trampoline matches rb_protect's callback signature and only
    // dereferences `call`, which outlives the call.
    let value = unsafe {
        rb_protect(
            Some(trampoline::<F>),
            &mut call as *mut Call<F> as VALUE,
            &mut state,
        )
    };
    if let Some(payload) = call.panic.take() {
        return Err(RbError::from_panic(payload));
    }
    if state == 0 {
        return Ok(value);
    }
    if state == TAG_RAISE {
        // SAFETY: after a raise caught by rb_protect, errinfo is the exception;
        // clearing it is what rb_protect's callers are expected to do.
        let exception = unsafe {
            let exception = rb_errinfo();
            rb_set_errinfo(Qnil as VALUE);
            exception
        };
        Err(RbError::Exception(exception))
    } else {
        Err(RbError::Jump(state))
    }
}

/// The body of every Ruby method implemented in Rust: runs `body`, turns a
/// panic or an error into a Ruby exception, and raises it only after every
/// Rust value of the body has been dropped.
pub fn method_entry<F: FnOnce() -> RbResult<VALUE>>(body: F) -> VALUE {
    let failure = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(value)) => return value,
        Ok(Err(error)) => error,
        Err(payload) => RbError::from_panic(payload),
    };
    raise(failure)
}

#[inline(never)]
fn raise(error: RbError) -> ! {
    let exception = match error {
        RbError::Exception(exception) => exception,
        // SAFETY: re-raises a jump caught by rb_protect; no Rust value with a
        // destructor is alive in this frame or its callers up to Ruby.
        RbError::Jump(tag) => unsafe { rb_jump_tag(tag) },
        RbError::New(class, message) => {
            let created = protect(|| {
                // SAFETY: the class globals are initialised once Ruby runs;
                // message's pointer and length describe valid bytes.
                unsafe {
                    let class = match class {
                        ErrorClass::Argument => rb_eArgError,
                        ErrorClass::Type => rb_eTypeError,
                        ErrorClass::State => defined_or_runtime(&STATE_ERROR),
                        ErrorClass::Internal => defined_or_runtime(&INTERNAL_ERROR),
                    };
                    rb_exc_new(class, message.as_ptr().cast(), message.len() as _)
                }
            });
            drop(message);
            match created {
                Ok(exception) => exception,
                Err(RbError::Exception(exception)) => exception,
                // SAFETY: as above, nothing with a destructor is alive.
                Err(RbError::Jump(tag)) => unsafe { rb_jump_tag(tag) },
                // The exception could not be built (a panic while building
                // it): fall back to a fixed message, which needs no cleanup.
                // SAFETY: static C string; nothing with a destructor is alive.
                Err(RbError::New(..)) => unsafe {
                    rb_exc_new_cstr(
                        defined_or_runtime(&INTERNAL_ERROR),
                        c"memprofiler_pprof_rs internal error".as_ptr(),
                    )
                },
            }
        }
    };
    // SAFETY: `exception` is a Ruby exception object; every Rust value of
    // this call has been dropped, so the longjmp skips only plain frames.
    unsafe { rb_exc_raise(exception) }
}
