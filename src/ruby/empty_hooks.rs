//! Hooks that do nothing, for `bench/`: the cost of the hook mechanism
//! alone, the floor that no profiler using it can go below. Built only with
//! the `bench-hooks` feature (`rake compile` turns it on; an installed gem
//! has it off).
//!
//! `MemprofilerPprof::EmptyHooks._native_enable(mechanism, events)` with
//! mechanism 0 = TracePoint (rb_tracepoint_new), 1 = raw event hook
//! (rb_add_event_hook2, flags as the collector's), and events a bitmask: 1 NEWOBJ, 2 FREEOBJ,
//! 4 C_RETURN. `_native_disable` removes them all.

use std::cell::UnsafeCell;
use std::ffi::c_void;

use rb_sys::{
    rb_event_flag_t, rb_event_hook_func_t, rb_gc_register_address, rb_remove_event_hook_with_data,
    rb_trace_arg_t, rb_tracepoint_disable, rb_tracepoint_enable, rb_tracepoint_new, Qfalse, Qnil,
    RUBY_EVENT_C_RETURN, RUBY_INTERNAL_EVENT_FREEOBJ, RUBY_INTERNAL_EVENT_NEWOBJ, VALUE,
};

use super::errors::{method_entry, protect, RbError};
use super::hooks::{add_event_hook2, HOOK_FLAGS};

const EVENTS: [u32; 3] = [
    RUBY_INTERNAL_EVENT_NEWOBJ,
    RUBY_INTERNAL_EVENT_FREEOBJ,
    RUBY_EVENT_C_RETURN,
];

/// The enabled TracePoints: GC roots (registered once, at load).
struct TracepointSlots(UnsafeCell<[VALUE; 3]>);

// SAFETY: only touched with the GVL held (method calls and GC marking).
unsafe impl Sync for TracepointSlots {}

static TRACEPOINTS: TracepointSlots = TracepointSlots(UnsafeCell::new([0; 3]));

/// Registers the TracePoint slots as GC roots (at load, GVL held).
pub fn init() {
    // SAFETY: at load with the GVL held; the slots are statics, so their
    // addresses stay valid for the process's life.
    unsafe {
        let slots = &mut *TRACEPOINTS.0.get();
        for slot in slots.iter_mut() {
            *slot = Qnil as VALUE;
            rb_gc_register_address(slot);
        }
    }
}

unsafe extern "C" fn empty_tracepoint_hook(_tracepoint: VALUE, _data: *mut c_void) {}

unsafe extern "C" fn empty_raw_hook(_data: VALUE, _arg: *const rb_trace_arg_t) {}

fn raw_hook() -> rb_event_hook_func_t {
    // SAFETY: with RUBY_EVENT_HOOK_FLAG_RAW_ARG Ruby calls the hook as
    // (VALUE data, const rb_trace_arg_t *): the real signature above.
    Some(unsafe {
        std::mem::transmute::<
            unsafe extern "C" fn(VALUE, *const rb_trace_arg_t),
            unsafe extern "C" fn(rb_event_flag_t, VALUE, VALUE, rb_sys::ID, VALUE),
        >(empty_raw_hook)
    })
}

pub unsafe extern "C" fn native_enable(_module: VALUE, mechanism: VALUE, events: VALUE) -> VALUE {
    method_entry(|| {
        // SAFETY: FIXNUM checks and conversions read the VALUE's bits only.
        let (mechanism, events) = unsafe {
            if !rb_sys::FIXNUM_P(mechanism) || !rb_sys::FIXNUM_P(events) {
                return Err(RbError::type_error("mechanism and events must be Integers"));
            }
            (rb_sys::FIX2LONG(mechanism), rb_sys::FIX2LONG(events))
        };
        disable_all()?;
        for (bit, &event) in EVENTS.iter().enumerate() {
            if events & (1 << bit) == 0 {
                continue;
            }
            match mechanism {
                0 => protect(|| {
                    // SAFETY: GVL held; the TracePoint is stored into a
                    // registered root before anything else allocates.
                    unsafe {
                        let slots = &mut *TRACEPOINTS.0.get();
                        slots[bit] = rb_tracepoint_new(
                            Qfalse as VALUE,
                            event,
                            Some(empty_tracepoint_hook),
                            std::ptr::null_mut(),
                        );
                        rb_tracepoint_enable(slots[bit])
                    }
                })?,
                1 => protect(|| {
                    // SAFETY: data Qnil is a special constant (Ruby marks hook
                    // data); the hook never touches it.
                    unsafe { add_event_hook2(raw_hook(), event, Qnil as VALUE, HOOK_FLAGS) };
                    Qnil as VALUE
                })?,
                other => return Err(RbError::argument(format!("unknown mechanism {other}"))),
            };
        }
        Ok(Qnil as VALUE)
    })
}

pub unsafe extern "C" fn native_disable(_module: VALUE) -> VALUE {
    method_entry(|| disable_all().map(|_| Qnil as VALUE))
}

fn disable_all() -> Result<(), RbError> {
    protect(|| {
        // SAFETY: GVL held; slots hold Qnil or TracePoints created above.
        unsafe {
            let slots = &mut *TRACEPOINTS.0.get();
            for slot in slots.iter_mut() {
                if *slot != Qnil as VALUE {
                    rb_tracepoint_disable(*slot);
                    *slot = Qnil as VALUE;
                }
            }
            rb_remove_event_hook_with_data(raw_hook(), Qnil as VALUE);
        }
        Qnil as VALUE
    })
    .map(|_| ())
}
