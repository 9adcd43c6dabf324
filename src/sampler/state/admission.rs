//! Where a new sample goes under the caps, and recording allocations and
//! frees. `admission` and `record_allocation` run in the NEWOBJ hook,
//! `record_free*` in the FREEOBJ hook: no Ruby call, no lock of Ruby's.

use rand::RngExt;

use super::{Liveness, ObjectInfo, SampleId, SampleRecord, SamplerState, TOMBSTONE};
use crate::sampler::reservoir::usable_weight;
use crate::sampler::stack_table::Frame;
use crate::sampler::types::ObjectAddress;

/// Where a new sample goes in the allocation list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocationSlot {
    /// The list has room.
    Append,
    /// The list is full: this entry was let go, and the new one takes it.
    Replace(usize),
    /// The list is full and the new sample is the one let go.
    Skip,
}

/// Where a new sample goes, given the caps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Admission {
    pub allocation: AllocationSlot,
    /// Tracked in the live map (false when it is full).
    pub live: bool,
    /// How many allocations the sample stands for.
    pub weight: f64,
}

impl Admission {
    /// In neither list: nothing to record (no backtrace needed).
    pub fn is_dropped(&self) -> bool {
        self.allocation == AllocationSlot::Skip && !self.live
    }
}

impl SamplerState {
    /// Decides, before any backtrace is captured, where a sample of
    /// `weight` (the allocations it stands for) goes, and counts what the
    /// caps keep out. When the allocation list is full, VarOpt sampling
    /// (sampler/reservoir.rs) chooses which sample to let go: heavy samples
    /// are kept first, and every kept one is scaled at the flush so that
    /// any part of the interval (a late spike, a phase) is still estimated
    /// without bias.
    pub fn admission(&mut self, weight: f64) -> Admission {
        // What the list's scales will assume it weighs.
        let weight = usable_weight(weight);
        let cap = self.max_allocation_samples;
        let uniform = self.retain_rng.random::<f64>();
        let allocation = match self.reservoir.offer(weight, uniform, cap) {
            Some(slot) if slot == self.allocations.len() => AllocationSlot::Append,
            Some(slot) => AllocationSlot::Replace(slot),
            None => AllocationSlot::Skip,
        };
        if allocation != AllocationSlot::Append {
            // One sample of the interval's was let go (the new one or another).
            self.drops.allocation_bufsize += 1;
        }
        let live = self.admit_live();
        if !live {
            self.drops.heap_bufsize += 1;
        }
        Admission {
            allocation,
            live,
            weight,
        }
    }

    /// Whether a new sample is tracked live. When the live map is full, the
    /// tracking rate halves and every tracked sample survives with
    /// probability 1/2, counting double: a hard memory bound that still
    /// represents the whole live heap, new objects included.
    fn admit_live(&mut self) -> bool {
        let cap = self.max_heap_samples;
        if cap == 0 {
            return false;
        }
        if self.live_keep_rate < 1.0 && self.live.len() * 4 < cap {
            // Room again: track new objects at a higher rate. (Samples keep
            // the weight they were admitted with, so mixing rates is fine.)
            self.live_keep_rate = (self.live_keep_rate * 2.0).min(1.0);
        }
        while self.live.len() >= cap && self.live_keep_rate > f64::MIN_POSITIVE {
            self.thin_live_samples();
        }
        self.live_keep_rate >= 1.0 || self.retain_rng.random::<f64>() < self.live_keep_rate
    }

    fn thin_live_samples(&mut self) {
        self.live_keep_rate /= 2.0;
        let mut dropped = Vec::new();
        let mut rng = self.retain_rng.clone();
        for (&object, &id) in &self.live {
            if rng.random::<bool>() {
                self.records[id.0 as usize].weight *= 2.0;
            } else {
                dropped.push(object);
            }
        }
        self.retain_rng = rng;
        self.drops.heap_bufsize += dropped.len() as u64;
        for object in dropped {
            self.stop_tracking(object);
        }
    }

    /// Takes an object that is still alive out of the live map; if it has not
    /// been measured yet, its free stays watched until it is.
    fn stop_tracking(&mut self, object: ObjectAddress) {
        let Some(id) = self.live.remove(&object) else {
            return;
        };
        let record = &mut self.records[id.0 as usize];
        if record.size == 0 {
            // Stays in the filter: still an address whose free matters. The
            // live map's reference passes to the watched map.
            record.liveness = Liveness::Watched;
            self.watched.insert(object, id);
        } else {
            record.liveness = Liveness::Untracked;
            self.free_filter.remove(object);
            self.release(id);
        }
    }

    /// Stops tracking every live object (when frees can no longer be seen,
    /// e.g. hooks paused for Ractors): their addresses would go stale.
    pub fn stop_tracking_live(&mut self) {
        let objects: Vec<ObjectAddress> = self.live.keys().copied().collect();
        for object in objects {
            self.stop_tracking(object);
        }
        self.forget_watched();
        self.forget_unresolved();
    }

    pub(super) fn forget_watched(&mut self) {
        for (object, id) in std::mem::take(&mut self.watched) {
            self.free_filter.remove(object);
            let record = &mut self.records[id.0 as usize];
            if record.liveness == Liveness::Watched {
                record.liveness = Liveness::Untracked;
            }
            self.release(id);
        }
    }

    /// Records a sampled allocation of `object` with backtrace `frames`,
    /// where `admission` put it.
    pub fn record_allocation(
        &mut self,
        object: ObjectAddress,
        info: ObjectInfo,
        frames: &[Frame],
        admission: Admission,
    ) -> Option<SampleId> {
        let weight = admission.weight;
        // A slot can be reused without a FREEOBJ for its previous object
        // (Ruby frees some internal objects silently): the old sample is dead.
        self.record_free(object);
        if admission.is_dropped() {
            return None;
        }
        let in_allocations = admission.allocation != AllocationSlot::Skip;
        let in_live = admission.live;
        let stack = self.stacks.intern(frames);
        let live_weight = if in_live {
            weight / self.live_keep_rate
        } else {
            weight
        };
        let record = SampleRecord {
            stack,
            info,
            weight: live_weight as f32,
            alloc_weight: weight as f32,
            alloc_dropped: false,
            size: 0,
            object,
            liveness: if in_live {
                Liveness::Live
            } else {
                Liveness::Watched
            },
            // The allocation list, and the live or the watched map.
            refs: u8::from(in_allocations) + 1,
        };
        let id = match self.free_records.pop() {
            Some(slot) => {
                self.records[slot as usize] = record;
                SampleId(slot)
            }
            None => {
                let slot = u32::try_from(self.records.len()).expect("fewer than 2^32 samples");
                if self.records.len() == self.records.capacity() {
                    // Grow by a quarter rather than doubling: the records are
                    // most of the collector's memory, and at most 20% of
                    // this capacity then sits unused.
                    self.records
                        .reserve_exact((self.records.len() / 4).max(256));
                }
                self.records.push(record);
                SampleId(slot)
            }
        };
        // A reused record slot starts without an object id.
        self.set_object_id(id, 0);
        match admission.allocation {
            AllocationSlot::Append => self.allocations.push(id),
            AllocationSlot::Replace(index) => {
                let evicted = std::mem::replace(&mut self.allocations[index], id);
                if evicted != TOMBSTONE {
                    self.release(evicted);
                }
            }
            AllocationSlot::Skip => {}
        }
        if in_live {
            self.live.insert(object, id);
        } else {
            self.watched.insert(object, id);
        }
        self.free_filter.insert(object);
        self.pending_sizes.push((id, object));
        Some(id)
    }

    /// The object at `object` was freed. Returns true if it was sampled.
    pub fn record_free(&mut self, object: ObjectAddress) -> bool {
        self.record_free_measuring(object, |_| None)
    }

    /// `record_free`, sizing a sample that was not measured yet with
    /// `measure` (called at most once, while the object is still intact).
    pub fn record_free_measuring(
        &mut self,
        object: ObjectAddress,
        measure: impl FnOnce(ObjectAddress) -> Option<u64>,
    ) -> bool {
        if !self.free_filter.may_contain(object) {
            return false;
        }
        let mut measure = Some(measure);
        let mut size_if_unmeasured = |record: &mut SampleRecord| {
            if record.size == 0 {
                if let Some(size) = measure.take().and_then(|m| m(object)) {
                    record.size = size;
                }
            }
        };
        // Usually empty (cleared at every measurement): skip the lookup.
        if !self.watched.is_empty() {
            if let Some(id) = self.watched.remove(&object) {
                let record = &mut self.records[id.0 as usize];
                size_if_unmeasured(record);
                record.liveness = Liveness::Freed;
                self.free_filter.remove(object);
                self.release(id);
            }
        }
        match self.live.remove(&object) {
            Some(id) => {
                let record = &mut self.records[id.0 as usize];
                size_if_unmeasured(record);
                record.liveness = Liveness::Freed;
                self.release(id);
                self.free_filter.remove(object);
                true
            }
            None => false,
        }
    }
}
