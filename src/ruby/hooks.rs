//! One raw event hook (NEWOBJ, FREEOBJ, C_RETURN): switched on and off
//! with the hook data a collector gives it. The hooks' bodies live with
//! the collector (`collector/sampling.rs`); the empty hooks of `empty_hooks.rs`
//! use the same registration for the benchmarks' floor.

use std::sync::atomic::{AtomicBool, Ordering};

use rb_sys::{
    rb_event_flag_t, rb_event_hook_flag_t, rb_event_hook_func_t, rb_remove_event_hook_with_data,
    rb_trace_arg_t, Qnil, ID, VALUE,
};

use super::errors::{protect, RbResult};

/// One raw event hook (rb_add_event_hook2 with RAW_ARG). Cheaper than a
/// TracePoint, which adds a function call and two typed-data checks to
/// every event (measured in bench/: see docs/performance.md). The hook's data is
/// the collector's address tagged as a Fixnum: Ruby marks hook data, and
/// marking skips Fixnums (an untagged pointer would be taken for an object).
pub struct Hook {
    event: u32,
    func: RawHook,
    enabled: AtomicBool,
}

/// What Ruby calls for a RAW_ARG hook: (data, trace arg).
pub type RawHook = unsafe extern "C" fn(VALUE, *mut rb_trace_arg_t);

/// RUBY_EVENT_HOOK_FLAG_SAFE | RUBY_EVENT_HOOK_FLAG_RAW_ARG, as Ruby's own
/// TracePoints use.
pub const HOOK_FLAGS: u32 = rb_event_hook_flag_t::RUBY_EVENT_HOOK_FLAG_SAFE as u32
    | rb_event_hook_flag_t::RUBY_EVENT_HOOK_FLAG_RAW_ARG as u32;

/// `rb_add_event_hook2` (ruby/debug.h), as rb-sys declares it, with the
/// flags as a plain integer: rb-sys gives them as a `#[repr(u32)]` Rust
/// enum, which has no variant for a combination of flags (and a value
/// outside an enum's variants is undefined behaviour in Rust). The C
/// parameter is an enum, passed as an unsigned int either way, so the
/// function is the same and only its Rust type changes.
///
/// # Safety
/// As for `rb_add_event_hook2`: GVL held; `func` fits the flags.
pub unsafe fn add_event_hook2(
    func: rb_event_hook_func_t,
    events: rb_event_flag_t,
    data: VALUE,
    hook_flags: u32,
) {
    type Declared =
        unsafe extern "C" fn(rb_event_hook_func_t, rb_event_flag_t, VALUE, rb_event_hook_flag_t);
    type WithIntegerFlags = unsafe extern "C" fn(rb_event_hook_func_t, rb_event_flag_t, VALUE, u32);
    // SAFETY: the two types differ only in the last parameter, a
    // #[repr(u32)] enum against a u32: the same C ABI.
    let add = unsafe {
        std::mem::transmute::<Declared, WithIntegerFlags>(rb_sys::rb_add_event_hook2 as Declared)
    };
    // SAFETY: the caller's contract.
    unsafe { add(func, events, data, hook_flags) }
}

impl Hook {
    pub fn new(event: u32, func: RawHook) -> Self {
        Hook {
            event,
            func,
            enabled: AtomicBool::new(false),
        }
    }

    fn ruby_func(&self) -> rb_event_hook_func_t {
        // SAFETY: with RUBY_EVENT_HOOK_FLAG_RAW_ARG Ruby calls the function
        // as (VALUE data, rb_trace_arg_t *arg), its real signature; the
        // declared type is only how the API passes it along.
        Some(unsafe {
            std::mem::transmute::<
                RawHook,
                unsafe extern "C" fn(rb_event_flag_t, VALUE, VALUE, ID, VALUE),
            >(self.func)
        })
    }

    pub fn is_enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    pub fn set(&self, on: bool, data: VALUE) -> RbResult<()> {
        if self.enabled.load(Ordering::Relaxed) == on {
            return Ok(());
        }
        let func = self.ruby_func();
        let event = self.event;
        protect(|| {
            // SAFETY: GVL held; `data` is a Fixnum-tagged collector address
            // (never dereferenced by Ruby); the collector removes its hooks
            // before it is freed (see `Drop for Collector`).
            unsafe {
                if on {
                    add_event_hook2(func, event, data, HOOK_FLAGS);
                } else {
                    rb_remove_event_hook_with_data(func, data);
                }
            }
            Qnil as VALUE
        })?;
        self.enabled.store(on, Ordering::Relaxed);
        Ok(())
    }
}
