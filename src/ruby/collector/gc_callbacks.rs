//! The collector's TypedData callbacks that Ruby's GC calls: mark (every
//! GC, minor ones included), compaction and memory size.
//!
//! Inside GC: no Ruby call, no Ruby allocation, no hook changes. The
//! sampler lock is taken, but its holders run with the GVL, which the GC's
//! thread has: a holder on this same thread (never by the collector's
//! rules) is refused as a re-entry and counted, not deadlocked
//! (crates/lock).

use std::sync::atomic::Ordering;

use rb_sys::{rb_gc_count, rb_gc_location, rb_gc_mark, VALUE};

use crate::ruby::classes::is_class_value;
use crate::ruby::convert::{object_address, object_value};
use crate::ruby::frames::BacktraceBuffer;
use crate::ruby::registry;

use super::Collector;

impl Collector {
    /// Marks every frame a stored stack refers to (pinned: they are also
    /// held as raw handles inside the stack table). Runs in every GC, minor
    /// ones included (the collector's TypedData is not write-barrier
    /// protected, so Ruby re-marks it each time), which makes it the GC
    /// tick of sampling windows.
    pub fn mark(&self) {
        if self.windows_active.load(Ordering::Relaxed) {
            // Allocation-free and async-signal-safe: the job throws the next
            // window's coin outside GC and outside any hook.
            registry::request_measurement();
        }
        // SAFETY: reads a counter (this GC's, counted at its start).
        let gc_count = unsafe { rb_gc_count() } as u32;
        match self.sampler.lock() {
            Ok(mut sampler) => {
                // Light mode: if a whole GC went by without this mark (only
                // after a failed lock, counted below), the pending objects
                // may be freed slots: never mark them, forget them.
                let marked = self.marked_at_gc.load(Ordering::Relaxed);
                let missed = marked != gc_count && marked != gc_count.wrapping_sub(1);
                if self.is_light() && missed {
                    sampler.state.forget_pending();
                }
                for frame in sampler.state.stacks().live_frames() {
                    // SAFETY: called from the dmark callback, during GC marking.
                    unsafe { rb_gc_mark(frame.0 as VALUE) };
                }
                // Classes too (an anonymous class may have no other owner).
                for class in sampler.state.held_classes().filter(|&c| is_class_value(c)) {
                    // SAFETY: as above.
                    unsafe { rb_gc_mark(class.0 as VALUE) };
                }
                // Light mode: samples waiting for their id stay alive and in
                // place until the postponed job (sampler/state/liveness.rs).
                if self.is_light() {
                    for object in sampler.state.pending_objects() {
                        // SAFETY: as above; each is an object a NEWOBJ hook
                        // received and this mark has kept alive since.
                        unsafe { rb_gc_mark(object_value(object)) };
                    }
                }
                self.marked_at_gc.store(gc_count, Ordering::Relaxed);
            }
            Err(_) => self.count_internal_error(),
        }
    }

    /// After GC.compact: sampled objects may have moved.
    pub fn update_references(&self) {
        if self.is_light() {
            // Tracked addresses may be stale slots on freed pages, so none is
            // read here; the postponed job finds the objects by id.
            // SAFETY: reads a counter.
            let gc_count = unsafe { rb_gc_count() } as u32;
            match self.sampler.lock() {
                Ok(mut sampler) => sampler.state.forget_addresses(gc_count, |object| {
                    // SAFETY: called from dcompact, only for addresses
                    // whose page is still there (see forget_addresses).
                    object_address(unsafe { rb_gc_location(object_value(object)) })
                }),
                Err(_) => self.count_internal_error(),
            }
            registry::request_measurement();
            return;
        }
        match self.sampler.lock() {
            Ok(mut sampler) => sampler.state.relocate_objects(|object| {
                // SAFETY: called from dcompact; every tracked address is a live
                // object or its forwarding (T_MOVED) slot.
                object_address(unsafe { rb_gc_location(object_value(object)) })
            }),
            Err(_) => self.count_internal_error(),
        }
    }

    pub fn memory_bytes(&self) -> usize {
        let state = self
            .sampler
            .lock()
            .map(|s| s.state.memory_bytes())
            .unwrap_or(0);
        std::mem::size_of::<Self>() + state + BacktraceBuffer::memory_bytes()
    }
}
