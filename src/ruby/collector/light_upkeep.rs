//! `mode: :light`'s upkeep: object ids for new samples, samples whose
//! object died, and samples moved by `GC.compact`.
//!
//! Called from the postponed job and before a flush: GVL held, outside GC,
//! never from a hook. Ruby is called (`rb_obj_id` may allocate, and so run
//! a GC whose mark callback takes the sampler lock), so the lock is never
//! held across a Ruby call, and after each call the pending samples are
//! read only if this collector's mark still pins them
//! (`pending_are_pinned`).

use std::sync::atomic::Ordering;

use rb_sys::rb_gc_count;

use crate::ruby::convert::object_value;
use crate::ruby::errors::RbResult;
use crate::ruby::heap;
use crate::ruby::window_timer::monotonic_ns;

use sampler::types::ObjectAddress;

use super::Collector;

impl Collector {
    /// Light mode's upkeep, from the postponed job and before a flush (GVL
    /// held, outside GC). In order:
    /// 1. after GC.compact, finds moved samples again by their ids;
    /// 2. gives new samples their object ids, then measures them (which
    ///    unpins them);
    /// 3. when due, forgets samples whose objects died.
    ///
    /// Ruby is called without the sampler lock (it may allocate, and so GC,
    /// and the GC's mark callback takes the lock).
    pub(super) fn settle_light(&self) -> RbResult<()> {
        self.settle_light_pruning(false)
    }

    /// Light mode: forgets every sample whose object died, now (a no-op in
    /// exact mode, where the FREEOBJ hook already has).
    pub fn forget_dead_samples(&self) -> RbResult<()> {
        if self.is_light() {
            self.settle_light_pruning(true)?;
        }
        Ok(())
    }

    /// `settle_light`; `prune`: look for dead samples even if not due.
    fn settle_light_pruning(&self, prune: bool) -> RbResult<()> {
        let began_ns = monotonic_ns();
        let settled = self.settle_light_steps(prune)?;
        if settled > 0 {
            // What new samples' upkeep costs counts against their share of
            // the time (sampler/sample_cost.rs).
            let ns = monotonic_ns().saturating_sub(began_ns);
            self.with_sampler(|s| s.windows.record_upkeep_time(ns, settled))?;
        }
        Ok(())
    }

    /// `settle_light_pruning`'s steps; returns how many new samples it
    /// gave ids and measured.
    fn settle_light_steps(&self, prune: bool) -> RbResult<usize> {
        // Once Ractors exist, nothing is tracked (pause_for_ractors), and
        // walking the heap is unsafe: another Ractor may be allocating from
        // the pages being swept (this corrupted malloc's heap in half the
        // runs of the Ractor spec).
        if self.is_paused_for_ractors() {
            return Ok(0);
        }
        if !self.pending_are_pinned() {
            self.with_sampler(|s| s.state.forget_pending())?;
        }
        let (unresolved, epoch) =
            self.with_sampler(|s| (s.state.unresolved(), s.state.compactions()))?;
        if !unresolved.is_empty() {
            // One walk over the heap finds them all (heap::find_objects_by_id).
            let ids = unresolved
                .iter()
                .map(|&(id, object_id)| (object_id, id.index()))
                .collect();
            let found = heap::find_objects_by_id(&ids)?;
            let placed: Vec<_> = unresolved
                .iter()
                .map(|&(id, _)| (id, found.get(&id.index()).map(|&a| ObjectAddress(a))))
                .collect();
            // (Nothing in the walk allocates, so no compaction can have run
            // meanwhile; the epoch check keeps that true if it ever does.)
            self.with_sampler(|s| {
                if s.state.compactions() == epoch {
                    s.state.resolve(&placed);
                }
            })?;
        }
        let pending = self.with_sampler(|s| s.state.pending_without_id())?;
        let mut ids = Vec::with_capacity(pending.len());
        let mut gone = Vec::new();
        let mut pinned = true;
        for (id, object) in pending {
            // rb_obj_id may allocate, and so run a GC: if that GC finished
            // marking without this collector (garbage, dropped while
            // running), the rest may be freed and even their slots reused.
            // Nothing of such a collector will be read again, so everything
            // pending goes unread and unmeasured.
            if !self.pending_are_pinned() {
                pinned = false;
                break;
            }
            // Pinned by the mark, so alive. A dead one would mean a path
            // that left it unmarked: counted (the torture fails on it) and
            // never asked for an id (see forget_pending).
            if !heap::is_live_object(object_value(object)) {
                self.count_internal_error();
                gone.push(object);
                continue;
            }
            ids.push((id, object, heap::object_id(object_value(object))?));
        }
        // (The last rb_obj_id may have run such a GC too; measuring reads
        // the objects. Nothing below allocates.)
        let pinned = pinned && self.pending_are_pinned();
        let settled = if pinned { ids.len() } else { 0 };
        // SAFETY: reads a counter.
        let gc_count = unsafe { rb_gc_count() } as u32;
        let prune_due = self.with_sampler(|s| {
            if pinned {
                for &object in &gone {
                    s.state.record_free(object);
                }
                s.state.assign_object_ids(&ids);
                s.state
                    .measure_pending(|object| heap::object_size(object_value(object)));
            } else {
                s.state.forget_pending();
            }
            s.state.prune_due(gc_count)
        })?;
        if prune || prune_due {
            // No Ruby allocation between listing the pages and the checks,
            // so no GC can free a page in between. (Listing them finishes a
            // lazy sweep, which runs no GC: the count stays.)
            let pages = heap::HeapPages::now()?;
            self.with_sampler(|s| {
                s.state.forget_dead(gc_count, |object, object_id| {
                    heap::is_same_object(&pages, object, object_id)
                })
            })?;
        }
        Ok(settled)
    }

    /// Whether light mode's pending samples are still held by this
    /// collector's mark: false once a GC has finished marking without
    /// calling it. That happens to a collector dropped while running: it is
    /// garbage, but its hooks and jobs run until its deferred free, while
    /// its pending objects are freed, their slots reused, their pages
    /// returned. (An incremental GC lets Ruby run between marking steps:
    /// until its marking ends, what the previous GC's mark held is still
    /// alive; not what an earlier one held, which the previous GC may have
    /// swept.)
    fn pending_are_pinned(&self) -> bool {
        // SAFETY: reads a counter (incremented as each GC starts).
        let now = unsafe { rb_gc_count() } as u32;
        let marked = self.marked_at_gc.load(Ordering::Relaxed);
        marked == now || (marked == now.wrapping_sub(1) && heap::gc_is_marking())
    }
}
