//! Liveness without a FREEOBJ hook (the collector's `:light` mode).
//!
//! In `:exact` mode a FREEOBJ hook tells the state about every free in the
//! process, so a tracked address is always a live object. That hook costs
//! every free a call, sampled or not. In `:light` mode nothing is told
//! about frees; instead each tracked sample carries its object's id
//! (`object_id`, never reused), and the binding layer checks, at a flush
//! and whenever enough new samples have come in (`prune_due`), whether the
//! object at a tracked address still has that id. The order of calls:
//!
//! ```text
//! NEWOBJ hook: record_allocation           the object is pinned (marked) while pending
//! postponed job: pending_without_id()      the binding asks Ruby for their ids ..
//!                assign_object_ids(..)     .. and hands them back; then measure_pending
//!                if prune_due(): forget_dead(is_alive)
//! flush: per chunk forget_dead_in_flush(.., is_alive), then measure_live
//! GC.compact (dcompact): forget_addresses()  no slot may be read there
//! postponed job: unresolved() -> resolve(..) each id looked up again
//! ```
//!
//! Why pending objects are pinned: the id is asked for from a postponed job
//! (never from the NEWOBJ hook, which must not call into Ruby), and until
//! then the object must not die and have its slot reused. The binding marks
//! `pending_objects()`; they are measured and let go at the next job. If a
//! GC ran without that mark (a collector dropped while running is garbage
//! until its deferred free), they are dropped unread: `forget_pending`.
//!
//! Why compaction drops addresses: a tracked address may be a slot freed
//! long ago, on a heap page since returned to the system, and reading it
//! from the compaction callback (`rb_gc_location`) could fault. The ids
//! stay true across moves, so the job looks each one up again.

use super::flush::FlushPhase;
use super::{Liveness, Measuring, SampleId, SamplerState};
use crate::types::ObjectAddress;

/// Fewest tracked samples before the first prune.
const MIN_PRUNE_AT: usize = 1_024;

impl SamplerState {
    /// Switches between the FREEOBJ hook (false) and object ids (true).
    /// Forgets every sample first: a sample tracked one way cannot be
    /// checked the other way.
    pub fn set_lazy_liveness(&mut self, lazy: bool) {
        self.clear();
        self.lazy_liveness = lazy;
        self.object_ids.clear();
        self.next_prune_at = MIN_PRUNE_AT;
    }

    pub fn lazy_liveness(&self) -> bool {
        self.lazy_liveness
    }

    /// The object id given to sample `id` (0: none yet).
    pub(super) fn object_id_of(&self, id: SampleId) -> u64 {
        self.object_ids.get(id.0 as usize).copied().unwrap_or(0)
    }

    pub(super) fn set_object_id(&mut self, id: SampleId, object_id: u64) {
        if !self.lazy_liveness {
            return;
        }
        let index = id.0 as usize;
        if self.object_ids.len() <= index {
            self.object_ids.resize(self.records.len().max(index + 1), 0);
        }
        self.object_ids[index] = object_id;
    }

    /// Objects sampled but not measured yet. In lazy mode the binding layer
    /// marks (and pins) them, so they stay alive and in place until the
    /// next postponed job has their ids and sizes.
    pub fn pending_objects(&self) -> impl Iterator<Item = ObjectAddress> + '_ {
        self.pending_sizes.iter().map(|&(_, object)| object)
    }

    /// Pending samples in the live map that have no object id yet.
    pub fn pending_without_id(&self) -> Vec<(SampleId, ObjectAddress)> {
        if !self.lazy_liveness {
            return Vec::new();
        }
        self.pending_sizes
            .iter()
            .filter(|&&(id, object)| {
                let record = &self.records[id.0 as usize];
                record.refs > 0
                    && record.object == object
                    && record.marks.liveness() == Liveness::Live
                    && self.object_id_of(id) == 0
            })
            .copied()
            .collect()
    }

    /// Forgets the samples still waiting for their ids without reading
    /// their objects, and returns how many. For when the binding finds that
    /// a GC finished marking without marking them (the collector itself was
    /// garbage, dropped while running and waiting for its deferred free):
    /// their slots may be free or reused, and their pages gone. Asking Ruby
    /// for the id of a freed slot would leave an entry in Ruby's id tables
    /// that nothing removes (Ruby 3.4 then crashes in a later GC.compact).
    pub fn forget_pending(&mut self) -> usize {
        let pending = std::mem::take(&mut self.pending_sizes);
        let mut forgotten = 0;
        for &(id, object) in &pending {
            let Some(record) = self.records.get(id.0 as usize) else {
                continue;
            };
            let tracked = matches!(record.marks.liveness(), Liveness::Live | Liveness::Watched);
            if record.refs > 0 && record.object == object && tracked && self.record_free(object) {
                forgotten += 1;
            }
        }
        // Keep the buffer's capacity for the next batch.
        self.pending_sizes = pending;
        self.pending_sizes.clear();
        forgotten
    }

    /// The ids the binding layer got for `pending_without_id`'s objects.
    /// An entry whose record changed meanwhile is ignored.
    pub fn assign_object_ids(&mut self, ids: &[(SampleId, ObjectAddress, u64)]) {
        for &(id, object, object_id) in ids {
            let record = &self.records[id.0 as usize];
            if record.refs > 0
                && record.object == object
                && record.marks.liveness() == Liveness::Live
            {
                self.set_object_id(id, object_id);
            }
        }
    }

    /// Whether to look for dead samples now (`gc_count`: Ruby's GC count).
    /// Deaths show only after a GC, and a full live map is thinned over
    /// the samples that follow, so: when the map has doubled since the
    /// last prune, or grown by an eighth of its cap; and, once it is within
    /// an eighth of the cap, after every GC. Amortised, a prune costs a few
    /// checks per sample.
    pub fn prune_due(&self, gc_count: u32) -> bool {
        if !self.lazy_liveness {
            return false;
        }
        let live = self.live.len();
        let cap = self.max_heap_samples;
        let nearly_full = live >= cap.saturating_sub(cap / 8);
        live >= self.next_prune_at || (nearly_full && self.all_verified_at != Some(gc_count))
    }

    fn schedule_next_prune(&mut self) {
        let live = self.live.len();
        let cap = self.max_heap_samples;
        let doubled = (2 * live).max(MIN_PRUNE_AT);
        let before_full = cap.saturating_sub(cap / 8);
        self.next_prune_at = doubled.min(before_full).max(live + (cap / 8).max(1));
    }

    /// Forgets every tracked sample (with an id) whose object `is_alive`
    /// says is gone. `is_alive(address, object_id)` must not let Ruby run
    /// a GC. `gc_count`: Ruby's GC count now (the survivors are known to
    /// be live objects until the next GC ends). Returns how many were
    /// forgotten.
    pub fn forget_dead(
        &mut self,
        gc_count: u32,
        mut is_alive: impl FnMut(ObjectAddress, u64) -> bool,
    ) -> usize {
        if !self.lazy_liveness {
            return 0;
        }
        let dead: Vec<ObjectAddress> = self
            .live
            .iter()
            .filter(|&(&object, &id)| {
                let object_id = self.object_id_of(id);
                object_id != 0 && !is_alive(object, object_id)
            })
            .map(|(&object, _)| object)
            .collect();
        for &object in &dead {
            self.record_free(object);
        }
        self.schedule_next_prune();
        self.all_verified_at = Some(gc_count);
        dead.len()
    }

    /// In a flush, before `measure_live` measures its next `max` objects:
    /// forgets those of them `is_alive` says are gone, so that only live
    /// objects get measured.
    pub fn forget_dead_in_flush(
        &mut self,
        _measuring: &Measuring,
        max: usize,
        mut is_alive: impl FnMut(ObjectAddress, u64) -> bool,
    ) {
        if !self.lazy_liveness {
            return;
        }
        let FlushPhase::Measuring(flush) = &self.phase else {
            return;
        };
        let start = flush.next_live;
        let end = flush.live_end.min(start.saturating_add(max));
        let mut dead = Vec::new();
        for index in start..end {
            let Some(object) = self.live_object(index) else {
                continue;
            };
            let object_id = self.object_id_of(SampleId(index as u32));
            if object_id != 0 && !is_alive(object, object_id) {
                dead.push(object);
            }
        }
        for object in dead {
            self.record_free(object);
        }
    }

    /// From the compaction callback of the GC numbered `gc_count`. A
    /// tracked address can be read there (`new_address`, rb_gc_location)
    /// only if its heap page cannot have been freed by an earlier GC: the
    /// sample was taken since the previous GC began, or a full prune since
    /// then found it alive. (Ruby frees empty pages at the end of a GC,
    /// after the compaction callbacks, which still read forwarding slots.)
    /// Every other sample with an id leaves the live map for `unresolved`,
    /// to be found again by id. Pending samples stay: they are pinned.
    pub fn forget_addresses(
        &mut self,
        gc_count: u32,
        new_address: impl FnMut(ObjectAddress) -> ObjectAddress,
    ) {
        if !self.lazy_liveness {
            return;
        }
        let previous = gc_count.wrapping_sub(1);
        if self.all_verified_at == Some(previous) {
            self.relocate_objects(new_address);
            return;
        }
        let unknown: Vec<(ObjectAddress, SampleId)> = self
            .live
            .iter()
            .filter(|&(_, &id)| {
                self.object_id_of(id) != 0
                    && self.records[id.0 as usize].info().gc_count != previous
            })
            .map(|(&object, &id)| (object, id))
            .collect();
        for (object, id) in unknown {
            self.live.remove(&object);
            self.free_filter.remove(object);
            // Unknown until resolved; a flush walking the live list skips it.
            self.records[id.0 as usize].object = ObjectAddress::NONE;
            self.unresolved.push(id);
        }
        // What is left is safe to read.
        self.relocate_objects(new_address);
        self.compactions += 1;
    }

    /// How many compactions `forget_addresses` has seen: objects found by
    /// id are only placed if none happened since they were looked up.
    pub fn compactions(&self) -> u64 {
        self.compactions
    }

    /// Samples whose address compaction made unknown, with their ids.
    pub fn unresolved(&self) -> Vec<(SampleId, u64)> {
        self.unresolved
            .iter()
            .map(|&id| (id, self.object_id_of(id)))
            .collect()
    }

    /// Where each of `unresolved()`'s objects is now (None: it is gone).
    /// Samples not in `found` stay unresolved.
    pub fn resolve(&mut self, found: &[(SampleId, Option<ObjectAddress>)]) {
        let found: crate::fast_hash::FastHashMap<SampleId, Option<ObjectAddress>> =
            found.iter().copied().collect();
        for id in std::mem::take(&mut self.unresolved) {
            match found.get(&id) {
                None => self.unresolved.push(id),
                Some(&Some(object)) => {
                    self.records[id.0 as usize].object = object;
                    if let Some(stale) = self.live.insert(object, id) {
                        // A tracked address the found object now occupies:
                        // that earlier object is gone.
                        self.records[stale.0 as usize]
                            .marks
                            .set_liveness(Liveness::Freed);
                        self.release(stale);
                    }
                    self.free_filter.insert(object);
                }
                Some(&None) => {
                    self.records[id.0 as usize]
                        .marks
                        .set_liveness(Liveness::Freed);
                    self.release(id);
                }
            }
        }
    }

    /// Drops every unresolved sample (the state is being cleared).
    pub(super) fn forget_unresolved(&mut self) {
        for id in std::mem::take(&mut self.unresolved) {
            self.records[id.0 as usize]
                .marks
                .set_liveness(Liveness::Untracked);
            self.release(id);
        }
    }
}
