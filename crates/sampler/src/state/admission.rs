//! Where a new sample goes under the caps, and recording allocations and
//! frees. `admission` and `record_allocation` run in the NEWOBJ hook,
//! `record_free*` in the FREEOBJ hook: no Ruby call, no lock of Ruby's.

use rand::RngExt;

use super::live_map::MOVE_STEP;
use super::{Liveness, Marks, ObjectInfo, SampleId, SampleRecord, SamplerState, TOMBSTONE};
use crate::reservoir::usable_weight;
use crate::stack_table::Frame;
use crate::threshold::{keep_probability, kept_weight, threshold_for};
use crate::types::ObjectAddress;

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
    /// How many live objects it stands for while tracked (more than
    /// `weight` when the live map is thinned; `weight` when not tracked).
    pub live_weight: f64,
}

impl Admission {
    /// In neither list: nothing to record (no backtrace needed).
    pub fn is_dropped(&self) -> bool {
        self.allocation == AllocationSlot::Skip && !self.live
    }
}

/// Thinning passes tried before a new sample is left out of a full live
/// map (each keeps half the cap in expectation).
const MAX_THINNING_PASSES: usize = 8;

/// Records each new sample thins while a thinning is under way.
pub(super) const THINNING_STEP: usize = 1_024;

/// Live weights a large map's threshold is found from.
const THRESHOLD_SAMPLE: usize = 2_048;

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
        let live_weight = self.admit_live(weight);
        if live_weight.is_none() {
            self.drops.heap_bufsize += 1;
        }
        Admission {
            allocation,
            live: live_weight.is_some(),
            weight,
            live_weight: live_weight.unwrap_or(weight),
        }
    }

    /// The weight a new sample of `weight` is tracked live with, or None
    /// when it is not tracked. When the live map is full, it is thinned by
    /// threshold sampling (sampler/threshold.rs) to half its cap, and new
    /// samples are tracked under the same threshold: a memory bound that
    /// still represents the whole live heap, new objects included, and
    /// keeps heavy samples before light ones.
    ///
    /// This runs in the NEWOBJ hook, so the work is bounded per sample: the
    /// threshold is found from at most `THRESHOLD_SAMPLE` live weights, and
    /// each new sample thins the next `THINNING_STEP` records (more where
    /// the records far outnumber the cap, so that a thinning ends within
    /// half the cap's samples). While a thinning is under way the map may
    /// run over its cap, by at most one sample per step still to go.
    fn admit_live(&mut self, weight: f64) -> Option<f64> {
        let cap = self.max_heap_samples;
        if cap == 0 {
            return None;
        }
        // (Samples unresolved after a compaction count: they come back.)
        if self.thinning_from.is_none() && self.live_threshold > 0.0 && self.live_count() * 4 < cap
        {
            // Room again: track new objects under a lower threshold.
            // (Samples keep the weight they were kept with, so mixing
            // thresholds is fine; weights are at least 1.)
            self.live_threshold /= 2.0;
            if self.live_threshold < 1.0 {
                self.live_threshold = 0.0;
            }
        }
        // Each thinning keeps half the cap in expectation: one is almost
        // always enough. A small map is thinned within one step, so a few
        // are tried; a large one gets this sample's step of its thinning.
        for _ in 0..MAX_THINNING_PASSES {
            if self.thinning_from.is_none()
                && (self.live_count() < cap || !self.begin_thinning(cap as f64 / 2.0))
            {
                break;
            }
            self.thin_step();
            if self.thinning_from.is_some() {
                break;
            }
        }
        let over = self.live_count() >= cap;
        if (over && self.thinning_from.is_none()) || self.live_count() >= cap.saturating_mul(2) {
            return None;
        }
        let probability = keep_probability(weight, self.live_threshold);
        (probability >= 1.0 || self.retain_rng.random::<f64>() < probability)
            .then(|| kept_weight(weight, self.live_threshold))
    }

    /// Sets the threshold that thins the live map to `target` samples in
    /// expectation, new samples included, and starts thinning from the
    /// first record. False if no threshold could thin it (none to thin,
    /// or weights beyond what a threshold can hold).
    fn begin_thinning(&mut self, target: f64) -> bool {
        let threshold = self.live_map_threshold(target);
        if !threshold.is_finite() || threshold <= 0.0 || self.live.is_empty() {
            return false;
        }
        self.live_threshold = threshold;
        self.thinning_from = Some(0);
        true
    }

    /// The threshold that keeps `target` samples of the live map in
    /// expectation: from every live weight in a small map, else from
    /// `THRESHOLD_SAMPLE` of them drawn at random (the threshold needs only
    /// the shape of the weights; any threshold chosen before the draws
    /// keeps the estimates unbiased).
    fn live_map_threshold(&mut self, target: f64) -> f64 {
        // (Unresolved samples are not in the map to thin: the map keeps
        // its share of the target.)
        let target = (target - self.unresolved.len() as f64).max(0.0);
        let mut weights = std::mem::take(&mut self.threshold_scratch);
        weights.clear();
        let mut scaled_target = target;
        if self.live.len() > 2 * THRESHOLD_SAMPLE && !self.records.is_empty() {
            for _ in 0..4 * THRESHOLD_SAMPLE {
                let index = self.retain_rng.random_range(0..self.records.len());
                let record = &self.records[index];
                if record.refs > 0 && record.marks.liveness() == Liveness::Live {
                    weights.push(record.weight);
                    if weights.len() == THRESHOLD_SAMPLE {
                        break;
                    }
                }
            }
            if weights.len() < THRESHOLD_SAMPLE / 8 {
                // Records mostly not live (a long allocation list): the
                // map's first entries, in an order that follows address
                // hashes, not weights.
                weights.clear();
                weights.extend(
                    self.live
                        .values()
                        .take(THRESHOLD_SAMPLE)
                        .map(|id| self.records[id.0 as usize].weight),
                );
            }
            scaled_target = target * weights.len() as f64 / self.live.len() as f64;
        } else {
            weights.extend(
                self.live
                    .values()
                    .map(|id| self.records[id.0 as usize].weight),
            );
        }
        let threshold = threshold_for(&mut weights, scaled_target);
        self.threshold_scratch = weights;
        threshold
    }

    /// Thins the next `THINNING_STEP` records (or more, see below) under
    /// the threshold: a live sample of weight w below it stays with
    /// probability w / threshold and then counts the threshold. (A record
    /// already thinned, or taken under the threshold, weighs the threshold
    /// or more, up to f32 rounding, and stays as it is.)
    fn thin_step(&mut self) {
        let Some(from) = self.thinning_from else {
            return;
        };
        let threshold = self.live_threshold;
        // Steps long enough that a thinning ends within half the cap's
        // samples, however many records the allocation list holds.
        let step = THINNING_STEP.max(2 * self.records.len() / self.max_heap_samples.max(1));
        let to = from.saturating_add(step).min(self.records.len());
        let mut rng = self.retain_rng.clone();
        for index in from..to {
            let record = &self.records[index];
            if record.refs == 0 || record.marks.liveness() != Liveness::Live {
                continue;
            }
            let weight = f64::from(record.weight);
            let probability = keep_probability(weight, threshold);
            if probability >= 1.0 {
                continue;
            }
            let object = record.object;
            if self.live.get(&object) != Some(&SampleId(index as u32)) {
                continue;
            }
            if rng.random::<f64>() < probability {
                self.records[index].weight = kept_weight(weight, threshold) as f32;
            } else {
                self.drops.heap_bufsize += 1;
                self.stop_tracking(object);
            }
        }
        self.retain_rng = rng;
        self.thinning_from = (to < self.records.len()).then_some(to);
    }

    /// While the live map grows (live_map.rs): moves the entries of the
    /// next `MOVE_STEP` records to its bigger table.
    fn move_live_step(&mut self) {
        let Some(from) = self.live.moving_from() else {
            return;
        };
        let to = from.saturating_add(MOVE_STEP).min(self.records.len());
        for record in &self.records[from.min(to)..to] {
            if record.refs > 0 && record.marks.liveness() == Liveness::Live {
                self.live.move_entry(record.object);
            }
        }
        self.live.moved_up_to(to, to >= self.records.len());
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
            record.marks.set_liveness(Liveness::Watched);
            self.watched.insert(object, id);
        } else {
            record.marks.set_liveness(Liveness::Untracked);
            self.free_filter.remove(object);
            self.release(id);
        }
    }

    /// Stops tracking every live object (when frees can no longer be seen,
    /// e.g. hooks paused for Ractors): their addresses would go stale.
    pub fn stop_tracking_live(&mut self) {
        self.thinning_from = None;
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
            if record.marks.liveness() == Liveness::Watched {
                record.marks.set_liveness(Liveness::Untracked);
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
        let record = SampleRecord {
            stack,
            class: info.class,
            gc_count: info.gc_count,
            window: info.window,
            window_probability: info.window_probability,
            labels: u16::try_from(info.labels.0).unwrap_or(0),
            weight: admission.live_weight as f32,
            alloc_weight: weight as f32,
            size: 0,
            object,
            // The allocation list, and the live or the watched map.
            refs: u8::from(in_allocations) + 1,
            marks: Marks::new(
                if in_live {
                    Liveness::Live
                } else {
                    Liveness::Watched
                },
                self.measuring_live(),
            ),
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
        if self.records[id.index()].marks.taken_in_walk() {
            self.taken_in_walk.push(id);
        }
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
            self.move_live_step();
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
                record.marks.set_liveness(Liveness::Freed);
                self.free_filter.remove(object);
                self.release(id);
            }
        }
        match self.live.remove(&object) {
            Some(id) => {
                let record = &mut self.records[id.0 as usize];
                size_if_unmeasured(record);
                record.marks.set_liveness(Liveness::Freed);
                self.release(id);
                self.free_filter.remove(object);
                true
            }
            None => false,
        }
    }
}
