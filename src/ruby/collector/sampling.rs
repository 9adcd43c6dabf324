//! What the event hooks and the postponed job do for a collector.
//!
//! - `newobj_hook`, `freeobj_hook`, `c_return_hook` run inside Ruby's
//!   allocation, free and C-return events, GVL held, sometimes inside GC
//!   (FREEOBJ always is): they never allocate a Ruby object, call Ruby,
//!   release the GVL, or add or remove hooks. They take the sampler lock
//!   (NEWOBJ without waiting: a busy lock is a counted drop), whose holders
//!   all run with the GVL (crates/lock); a panic is counted, never
//!   unwound.
//! - `measure_pending` and `next_window` run from the postponed job (GVL
//!   held, outside GC): they may take the lock, and in light mode call
//!   Ruby (`light_upkeep`), never while holding it.

use std::ffi::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;

use rb_sys::{rb_trace_arg_t, rb_tracearg_lineno, rb_tracearg_object, VALUE};

use crate::ruby::classes::object_info;
use crate::ruby::convert::{fixnum, object_address, object_value};
use crate::ruby::gvl::current_thread;
use crate::ruby::heap;
use crate::ruby::labels;
use crate::ruby::registry;
use crate::ruby::window_timer::{self, monotonic_ns};
use sampler_lock::LockError;

use super::{Collector, Sampler, SizeMeasurement};

/// Samples that may wait before a postponed job measures them: each job
/// run costs a few hundred nanoseconds, and more in the caches, since the
/// program has evicted the job's code and data since the last (a sample
/// freed meanwhile is sized in the FREEOBJ hook; in light mode, pinned
/// by the collector's mark until then).
const MEASURE_BATCH: usize = 32;

impl Collector {
    /// NEWOBJ for an allocation the countdown chose (see `newobj_hook`).
    /// `top_line`: the innermost Ruby frame's line, from the trace arg.
    fn on_sampled_newobj(&self, object: VALUE, top_line: impl FnOnce() -> c_int) {
        let suppressed = self.suppressed_thread.load(Ordering::Relaxed);
        if suppressed != 0 && suppressed == current_thread() {
            // (The countdown stays at 0: the next allocation is this event.)
            self.overrun.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let mut sampler = match self.sampler.try_lock() {
            Ok(guard) => guard,
            Err(error) => {
                if error == LockError::Reentered {
                    self.count_internal_error();
                }
                self.nolock_drops.fetch_add(1, Ordering::Relaxed);
                self.overrun.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        let Sampler {
            state,
            backtrace,
            windows,
            ..
        } = &mut *sampler;
        // With windows the countdown runs to the next event (a sample or a
        // window's end: sampler/windows/mod.rs); without, to the next sample.
        let window = if windows.enabled() {
            let event = windows.on_event(self.overrun.swap(0, Ordering::Relaxed));
            self.countdown.set(event.countdown);
            if event.switch_off {
                registry::request_measurement();
            }
            match event.sample {
                Some(window) => Some(window),
                None => return,
            }
        } else {
            self.countdown.set(state.gaps.next_gap());
            None
        };
        // What the sample costs is measured (sampler/sample_cost.rs).
        let began_ns = window.map(|_| monotonic_ns());
        // A sample in a window also stands for the allocations the windows
        // left out: 1 / (its window's sample rate x probability).
        let weight = match window {
            Some(sampled) => 1.0 / sampled.probability,
            None => state.gaps.weight(),
        };
        let admission = state.admission(weight);
        if admission.is_dropped() {
            // Still forget a sample whose address was reused without a free.
            state.record_free(object_address(object));
            return;
        }
        // SAFETY: we are in the NEWOBJ hook for `object`, on a Ruby thread
        // with the GVL.
        let (mut info, frames) = unsafe { (object_info(object), backtrace.capture(top_line)) };
        if let Some(sampled) = window {
            info.set_window(sampled.window, sampled.window_probability);
        }
        info.labels = labels::current();
        state.record_allocation(object_address(object), info, frames, admission);
        if let Some(began_ns) = began_ns {
            windows.record_sample_time(monotonic_ns().saturating_sub(began_ns));
        }
        // Measuring costs a postponed job: samples wait for a batch, or
        // for whatever job comes first (the one that switches the hook off
        // when a window ends, a GC's, the next poll's; a flush measures the
        // rest). In exact mode a sample of a type that cannot be sized at
        // its free asks now. In light mode no free is seen and the object
        // is pinned by the collector's mark until its job: with windows
        // that is a batch or the hook's time on at most, and a GC in
        // between keeps a garbage sample's object one cycle longer (each
        // job runs cold code: docs/performance.md). Without windows every
        // sample asks at once.
        let batch_full = state.pending_count() >= MEASURE_BATCH;
        let measure_now = if self.is_light() {
            batch_full || !windows.enabled()
        } else {
            batch_full || !heap::measurable_at_free(object)
        };
        drop(sampler);
        self.has_pending.store(true, Ordering::Relaxed);
        if measure_now && self.size_measurement.get() == SizeMeasurement::PostponedJob {
            registry::request_measurement();
        }
    }

    #[inline]
    fn on_freeobj(&self, object: VALUE) {
        // Nearly every freed object was never sampled: no lock for those.
        if !self.free_filter.may_contain(object_address(object)) {
            return;
        }
        match self.sampler.lock() {
            Ok(mut sampler) => {
                // A sample that dies before its measurement ran is sized now.
                sampler
                    .state
                    .record_free_measuring(object_address(object), |o| {
                        heap::size_at_free(object_value(o))
                    });
            }
            // Only possible if the collector's own locked code triggered a
            // GC, which it is written never to do.
            Err(_) => self.count_internal_error(),
        }
    }

    #[inline]
    fn on_c_return(&self) {
        if self.has_pending.load(Ordering::Relaxed) {
            self.measure_pending();
        }
    }

    /// Sizes newly sampled objects (at a safe point where the allocating code
    /// has filled them in). Holds the lock but calls nothing that allocates.
    /// In light mode, also gives them object ids and looks for dead samples
    /// (`settle_light`).
    pub fn measure_pending(&self) {
        if self.is_light() {
            // (Cleared first: a sample taken meanwhile sets it again. Left
            // set, every C method's return would settle again.)
            self.has_pending.store(false, Ordering::Relaxed);
            if self.settle_light().is_err() {
                self.count_internal_error();
            }
            return;
        }
        if let Ok(mut sampler) = self.sampler.try_lock() {
            self.has_pending.store(false, Ordering::Relaxed);
            sampler
                .state
                .measure_pending(|object| heap::object_size(object_value(object)));
        }
    }

    /// With sampling windows (postponed job, woken by the windows' timer
    /// thread, a GC or the hook): polls the windows, switches the NEWOBJ
    /// hook to match, and says when to poll next.
    pub(super) fn next_window(&self) {
        // (The job runs for every batch of samples too: nothing to do there
        // without windows.)
        if !self.windows_active.load(Ordering::Relaxed) || self.is_paused_for_ractors() {
            return;
        }
        let counter = heap::allocation_counter();
        let polled = self.with_sampler(|s| {
            let poll = s.windows.poll(counter, window_timer::poll_time());
            if let Some(countdown) = poll.countdown {
                // Armed: the countdown runs from the next allocation.
                self.countdown.set(countdown);
                self.overrun.store(0, Ordering::Relaxed);
            }
            poll
        });
        match polled {
            Ok(poll) => {
                window_timer::schedule(poll.next_poll_in_ns, registry::request_measurement);
                if self.newobj.is_enabled() != poll.hook_on && self.apply_hooks().is_err() {
                    self.count_internal_error();
                }
            }
            Err(_) => self.count_internal_error(),
        }
    }
}

/// Runs a hook's body for the collector tagged in `data`; a panic is
/// counted, never unwound into Ruby. Hooks never raise, never allocate a
/// Ruby object and never release the GVL.
#[inline(always)]
fn in_hook(data: VALUE, body: impl FnOnce(&Collector)) {
    // SAFETY: `data` is `hook_data()` of a collector that removes its hooks
    // before it is dropped.
    let collector = unsafe { &*((data & !1) as *const Collector) };
    if catch_unwind(AssertUnwindSafe(|| body(collector))).is_err() {
        collector.count_internal_error();
    }
}

pub(super) unsafe extern "C" fn newobj_hook(data: VALUE, arg: *mut rb_trace_arg_t) {
    in_hook(data, |collector| {
        // The common case, first and cheapest: not this allocation.
        if collector.countdown.skip() {
            return;
        }
        // SAFETY (both): a NEWOBJ trace arg carries the new object, and the
        // frame it was allocated in, whose line rb_tracearg_lineno reads
        // from the frame's pc, returning a Fixnum, without allocating
        // (ObjectSpace's allocation tracing calls it from this same hook).
        collector.on_sampled_newobj(unsafe { rb_tracearg_object(arg) }, || {
            fixnum(unsafe { rb_tracearg_lineno(arg) }).map_or(0, |line| line as c_int)
        });
    });
}

pub(super) unsafe extern "C" fn freeobj_hook(data: VALUE, arg: *mut rb_trace_arg_t) {
    in_hook(data, |collector| {
        // SAFETY: a FREEOBJ trace arg carries the object being freed.
        collector.on_freeobj(unsafe { rb_tracearg_object(arg) });
    });
}

pub(super) unsafe extern "C" fn c_return_hook(data: VALUE, _arg: *mut rb_trace_arg_t) {
    in_hook(data, |collector| collector.on_c_return());
}
