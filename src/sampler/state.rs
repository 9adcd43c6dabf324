//! Everything the collector remembers between flushes: the sampled
//! allocations of the current interval (the allocation list), the sampled
//! objects still alive (the live-object map) and their deduplicated stacks.
//!
//! One `SampleRecord` is shared by the allocation list and the live map and
//! refcounted by them, so an object allocated in this interval and still alive
//! costs one record. Nothing here calls into Ruby; the binding layer passes
//! object addresses in and measures sizes through callbacks.

use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};

use super::address_filter::{AddressFilter, DEFAULT_BUCKETS_LOG2};
use super::gaps::{mix_seed, GapSampler};
use super::named_classes::NamedClasses;
use super::stack_table::{Frame, FrameInfo, StackId, StackTable};
use super::types::{is_named_class, is_ruby_class, ClassRef, FrameRef, ObjectAddress};
use crate::fast_hash::FastHashMap;

/// What the binding layer knows about an object when it is sampled.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ObjectInfo {
    pub class: ClassRef,
    /// Number of GCs so far (`GC.count`), to tell the object's age later.
    pub gc_count: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SampleId(u32);

#[derive(Debug, Clone)]
struct SampleRecord {
    stack: StackId,
    info: ObjectInfo,
    /// How many live objects this sample stands for (1 / rate when taken).
    /// f32 (7 significant digits) keeps the record at 48 bytes.
    weight: f32,
    /// How many allocations it stands for in the allocation profile: weight
    /// divided by allocation_retain_rate once it survives that thinning.
    alloc_weight: f32,
    /// Left the allocation list early (allocation_retain_rate thinning).
    alloc_dropped: bool,
    /// Bytes, as last measured; 0 until the first measurement.
    size: u64,
    /// The sampled object's address (stale once the object is freed).
    object: ObjectAddress,
    liveness: Liveness,
    /// Held by the allocation list and/or the live or watched map (which
    /// stops a watched address from pointing at a reused record); 0 = the
    /// slot is free.
    refs: u8,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Liveness {
    /// In the live map: not seen freed yet.
    Live,
    /// Was in the live map; its object has been freed.
    Freed,
    /// Not in the live map, but its free is watched until it is measured
    /// (so the measurement never touches a freed object).
    Watched,
    /// Not tracked: whether it lives is unknown.
    Untracked,
}

/// Samples not taken, by reason, since the last flush.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DropCounters {
    /// The sampler lock was busy (or re-entered) when the allocation happened.
    pub nolock: u64,
    /// The allocation list was full (`max_allocation_samples`).
    pub allocation_bufsize: u64,
    /// The live map was full (`max_heap_samples`); the allocation was still
    /// recorded in the allocation list.
    pub heap_bufsize: u64,
}

/// Where a new sample goes in the allocation list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocationSlot {
    /// The list has room.
    Append,
    /// The list is full: reservoir sampling chose this entry to replace.
    Replace(usize),
    /// The list is full and the sample lost the draw.
    Skip,
}

/// Where a new sample goes, given the caps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    pub allocation: AllocationSlot,
    /// Tracked in the live map (false when it is full).
    pub live: bool,
}

impl Admission {
    /// In neither list: nothing to record (no backtrace needed).
    pub fn is_dropped(&self) -> bool {
        self.allocation == AllocationSlot::Skip && !self.live
    }
}

/// An allocation-list entry whose sample was thinned out by
/// allocation_retain_rate: it keeps its reservoir slot (so the reservoir's
/// odds stay right) but contributes nothing.
const TOMBSTONE: SampleId = SampleId(u32::MAX);

/// One sample's contribution to a flushed profile, already weighted:
/// [alloc_objects, alloc_space, inuse_objects, inuse_space].
#[derive(Debug, Clone, PartialEq)]
pub struct FlushedSample {
    pub stack: StackId,
    pub class: ClassRef,
    /// For live objects: how many GCs they have survived.
    pub gc_age: Option<u32>,
    pub values: [f64; 4],
}

/// A flush between `begin_flush` and `end_snapshot`. Kept inside the state
/// so that GC compaction can re-address it and a forked child (or any other
/// end of the flush) can release what it holds.
#[derive(Debug)]
struct FlushInProgress {
    /// Live objects when the flush began, measured `next_live..` onwards.
    live: Vec<(ObjectAddress, SampleId)>,
    next_live: usize,
    /// The detached allocation list (its entries still hold their records).
    allocations: Vec<SampleId>,
    allocations_seen: u64,
    samples: Vec<FlushedSample>,
    drops: DropCounters,
}

/// What one flush reads out of the state, detached from it so the profile
/// can be built without holding the lock.
#[derive(Debug, Default)]
pub struct FlushSnapshot {
    pub samples: Vec<FlushedSample>,
    pub stacks: FastHashMap<StackId, Arc<[Frame]>>,
    /// Names of the resolved frames (held by name since an earlier flush)
    /// that `stacks` contains; the binding layer names the others.
    pub resolved_frames: FastHashMap<FrameRef, FrameInfo>,
    /// Names of the classes held by name that `samples` refer to.
    pub resolved_classes: FastHashMap<ClassRef, String>,
    pub allocation_samples: usize,
    pub heap_samples: usize,
    pub drops: DropCounters,
}

#[derive(Debug)]
pub struct SamplerState {
    stacks: StackTable,
    records: Vec<SampleRecord>,
    free_records: Vec<u32>,
    live: FastHashMap<ObjectAddress, SampleId>,
    /// The allocation list: a reservoir of at most max_allocation_samples
    /// of this interval's samples, uniformly chosen among all of them.
    allocations: Vec<SampleId>,
    /// Samples offered to the allocation list this interval.
    allocations_seen: u64,
    /// Probability that a new sample is tracked in the live map: halved
    /// each time the map fills (existing samples are thinned to match),
    /// raised again once it has room. Kept samples count 1 / keep_rate.
    live_keep_rate: f64,
    /// Samples taken but not yet measured (sizes are known only once the
    /// allocating method has filled the object in).
    pending_sizes: Vec<(SampleId, ObjectAddress)>,
    /// Objects of pending samples that are not in the live map, watched for
    /// their free until measured.
    watched: FastHashMap<ObjectAddress, SampleId>,
    pub gaps: GapSampler,
    pub max_allocation_samples: usize,
    pub max_heap_samples: usize,
    /// Fraction of measured samples kept in the allocation profile.
    allocation_retain_rate: f64,
    /// Between `take_snapshot` and `finish_flush`: stacks must not be pruned,
    /// because the flush is still resolving their frames.
    flush_in_progress: bool,
    /// Draws for allocation_retain_rate.
    retain_rng: SmallRng,
    /// Classes of the flush in progress: held until `finish_flush`, since
    /// the samples that referred to them may already be released.
    flush_classes: Vec<ClassRef>,
    /// Classes of samples held by name (after a flush named them).
    named_classes: NamedClasses,
    /// Holds the flush in progress took on named classes.
    flush_named_holds: Vec<ClassRef>,
    drops: DropCounters,
    /// Counts of the addresses in `live` and `watched` (disjoint): shared
    /// with the FREEOBJ hook, which reads it without the lock.
    free_filter: Arc<AddressFilter>,
    /// The flush being read out in steps, if any.
    flush: Option<FlushInProgress>,
}

/// Removes every entry of `map` whose object moved, returning it with its
/// new address. All are removed before any is re-inserted by the caller,
/// because a new address may be another entry's old one.
fn take_moved(
    map: &mut FastHashMap<ObjectAddress, SampleId>,
    new_address: &mut impl FnMut(ObjectAddress) -> ObjectAddress,
) -> Vec<(SampleId, ObjectAddress)> {
    let moved: Vec<(ObjectAddress, ObjectAddress)> = map
        .keys()
        .filter_map(|&old| {
            let new = new_address(old);
            (new != old).then_some((old, new))
        })
        .collect();
    moved
        .into_iter()
        .filter_map(|(old, new)| Some((map.remove(&old)?, new)))
        .collect()
}

impl SamplerState {
    pub fn new(gaps: GapSampler, max_allocation_samples: usize, max_heap_samples: usize) -> Self {
        let retain_seed = gaps.seed().wrapping_add(1);
        SamplerState {
            stacks: StackTable::new(),
            named_classes: NamedClasses::default(),
            flush_named_holds: Vec::new(),
            records: Vec::new(),
            free_records: Vec::new(),
            live: FastHashMap::default(),
            allocations: Vec::new(),
            allocations_seen: 0,
            live_keep_rate: 1.0,
            pending_sizes: Vec::new(),
            watched: FastHashMap::default(),
            gaps,
            max_allocation_samples,
            max_heap_samples,
            allocation_retain_rate: 1.0,
            flush_in_progress: false,
            retain_rng: SmallRng::seed_from_u64(retain_seed),
            flush_classes: Vec::new(),
            drops: DropCounters::default(),
            free_filter: Arc::new(AddressFilter::new(DEFAULT_BUCKETS_LOG2)),
            flush: None,
        }
    }

    /// The filter of tracked addresses, for a lock-free check before
    /// `record_free` (a false answer means `record_free` would do nothing).
    pub fn free_filter(&self) -> Arc<AddressFilter> {
        Arc::clone(&self.free_filter)
    }

    fn rebuild_free_filter(&mut self) {
        self.free_filter
            .rebuild(self.live.keys().chain(self.watched.keys()).copied());
    }

    /// Restarts every random draw from `seed`, for reproducible runs.
    pub fn reseed(&mut self, seed: u64) {
        self.gaps = GapSampler::new(self.gaps.rate(), seed);
        self.retain_rng = SmallRng::seed_from_u64(seed.wrapping_add(1));
    }

    /// Sets the fraction (0..=1) of samples kept in the allocation profile
    /// once measured; the rest only count while alive (inuse_*). Kept
    /// samples are re-weighted by 1 / rate so totals stay unbiased.
    pub fn set_allocation_retain_rate(&mut self, rate: f64) {
        assert!(
            (0.0..=1.0).contains(&rate),
            "allocation_retain_rate {rate} outside 0..=1"
        );
        self.allocation_retain_rate = rate;
    }

    pub fn allocation_retain_rate(&self) -> f64 {
        self.allocation_retain_rate
    }

    /// Decides, before any backtrace is captured, where a sample goes, and
    /// counts what the caps keep out. When the allocation list is full it
    /// becomes a reservoir: the n-th sample of the interval replaces a
    /// random entry with probability cap / n, so what is kept stays a
    /// uniform sample of the whole interval (a late spike shows up) and
    /// `take_snapshot` scales it back up to the whole interval.
    pub fn admission(&mut self) -> Admission {
        self.allocations_seen += 1;
        let cap = self.max_allocation_samples;
        let allocation = if self.allocations.len() < cap {
            AllocationSlot::Append
        } else {
            self.drops.allocation_bufsize += 1;
            let draw = (self.retain_rng.random::<f64>() * self.allocations_seen as f64) as u64;
            match usize::try_from(draw) {
                Ok(index) if index < self.allocations.len() => AllocationSlot::Replace(index),
                _ => AllocationSlot::Skip,
            }
        };
        let live = self.admit_live();
        if !live {
            self.drops.heap_bufsize += 1;
        }
        Admission { allocation, live }
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
    }

    fn forget_watched(&mut self) {
        for (object, id) in std::mem::take(&mut self.watched) {
            self.free_filter.remove(object);
            let record = &mut self.records[id.0 as usize];
            if record.liveness == Liveness::Watched {
                record.liveness = Liveness::Untracked;
            }
            self.release(id);
        }
    }

    /// Records a sampled allocation of `object` with backtrace `frames`.
    pub fn record_allocation(
        &mut self,
        object: ObjectAddress,
        info: ObjectInfo,
        frames: &[Frame],
        weight: f64,
        admission: Admission,
    ) -> Option<SampleId> {
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

    /// Samples waiting to be measured.
    pub fn pending_count(&self) -> usize {
        self.pending_sizes.len()
    }

    /// Measures samples taken since the last call, while their objects are
    /// alive. `measure` returns None for an object that is no longer valid.
    pub fn measure_pending(&mut self, mut measure: impl FnMut(ObjectAddress) -> Option<u64>) {
        let mut rng = self.retain_rng.clone();
        self.measure_pending_with(&mut measure, &mut || rng.random::<f64>());
        self.retain_rng = rng;
    }

    /// `measure_pending`, applying allocation_retain_rate with `uniform`
    /// (a source of uniform numbers in [0, 1)) to each measured sample.
    pub fn measure_pending_with(
        &mut self,
        measure: &mut impl FnMut(ObjectAddress) -> Option<u64>,
        uniform: &mut impl FnMut() -> f64,
    ) {
        let pending = std::mem::take(&mut self.pending_sizes);
        let mut dropped_any = false;
        for &(id, object) in &pending {
            let Some(record) = self.records.get(id.0 as usize) else {
                continue;
            };
            // The record may have been freed (and even reused) since.
            if record.refs == 0 || record.object != object || record.size != 0 {
                continue;
            }
            // Only objects whose free is watched (live map, or watched until
            // measured) are known to be alive; an untracked one may sit on a
            // heap page that is gone, so it is never touched.
            if record.liveness != Liveness::Live && record.liveness != Liveness::Watched {
                continue;
            }
            match measure(object) {
                Some(size) => {
                    let retain = self.allocation_retain_rate;
                    let record = &mut self.records[id.0 as usize];
                    record.size = size;
                    if retain < 1.0 && !record.alloc_dropped {
                        if uniform() < retain {
                            record.alloc_weight /= retain as f32;
                        } else {
                            record.alloc_dropped = true;
                            dropped_any = true;
                        }
                    }
                }
                None => {
                    self.record_free(object);
                }
            }
        }
        // Every pending sample has now been measured (or found gone).
        self.forget_watched();
        if dropped_any {
            self.release_dropped_allocations();
        }
        // Keep the buffer's capacity for the next batch.
        self.pending_sizes = pending;
        self.pending_sizes.clear();
    }

    /// Turns thinned-out samples' allocation-list entries into tombstones.
    fn release_dropped_allocations(&mut self) {
        let mut released = Vec::new();
        for entry in self.allocations.iter_mut() {
            if *entry != TOMBSTONE && self.records[entry.0 as usize].alloc_dropped {
                released.push(std::mem::replace(entry, TOMBSTONE));
            }
        }
        for id in released {
            self.release(id);
        }
    }

    /// After GC compaction: `new_address` maps each tracked object's old
    /// address to its new one (or returns it unchanged).
    pub fn relocate_objects(
        &mut self,
        mut new_address: impl FnMut(ObjectAddress) -> ObjectAddress,
    ) {
        for (id, new) in take_moved(&mut self.live, &mut new_address) {
            self.records[id.0 as usize].object = new;
            if let Some(stale) = self.live.insert(new, id) {
                // A key left over at the new address (its free was missed):
                // that object is gone.
                self.records[stale.0 as usize].liveness = Liveness::Freed;
                self.release(stale);
            }
        }
        for (id, new) in take_moved(&mut self.watched, &mut new_address) {
            self.records[id.0 as usize].object = new;
            if let Some(stale) = self.watched.insert(new, id) {
                self.records[stale.0 as usize].liveness = Liveness::Freed;
                self.release(stale);
            }
        }
        for (id, object) in &mut self.pending_sizes {
            if let Some(record) = self.records.get(id.0 as usize) {
                let watched = matches!(record.liveness, Liveness::Live | Liveness::Watched);
                if record.refs > 0 && watched {
                    *object = record.object;
                }
            }
        }
        if let Some(flush) = &mut self.flush {
            for (object, id) in &mut flush.live {
                if let Some(record) = self.records.get(id.0 as usize) {
                    if record.refs > 0 && record.liveness == Liveness::Live {
                        *object = record.object;
                    }
                }
            }
        }
        self.rebuild_free_filter();
    }

    /// Every tracked (live) object's address, e.g. to check after a GC.
    pub fn live_objects(&self) -> impl Iterator<Item = ObjectAddress> + '_ {
        self.live.keys().copied()
    }

    #[cfg(test)]
    pub fn has_pending_sizes(&self) -> bool {
        !self.pending_sizes.is_empty()
    }

    /// Reads out a flush at once: `begin_flush`, `measure_live` over every
    /// live object, `end_snapshot`.
    pub fn take_snapshot(
        &mut self,
        gc_count: u32,
        mut measure: impl FnMut(ObjectAddress) -> Option<u64>,
    ) -> FlushSnapshot {
        self.begin_flush();
        while !self.measure_live(gc_count, usize::MAX, &mut measure) {}
        self.end_snapshot(&mut measure)
    }

    /// First step of a flush: detaches the allocation list (allocations from
    /// now on belong to the next flush) and lists the live objects to
    /// measure. Cheap, so the caller can then measure them in chunks with
    /// `measure_live`, letting other threads run in between. Stacks stay
    /// stored until `finish_flush`, so the caller can resolve their frames.
    pub fn begin_flush(&mut self) {
        self.abandon_flush();
        self.flush_in_progress = true;
        self.pending_sizes.clear();
        self.forget_watched();
        self.flush_classes.clear();
        self.flush = Some(FlushInProgress {
            live: self
                .live
                .iter()
                .map(|(&object, &id)| (object, id))
                .collect(),
            next_live: 0,
            allocations: std::mem::take(&mut self.allocations),
            allocations_seen: std::mem::take(&mut self.allocations_seen),
            samples: Vec::new(),
            drops: std::mem::take(&mut self.drops),
        });
    }

    /// Measures up to `max` of the flush's live objects (those freed since
    /// `begin_flush` are skipped; those `measure` finds invalid are counted
    /// as freed). Returns true when all are done (or no flush is begun).
    pub fn measure_live(
        &mut self,
        gc_count: u32,
        max: usize,
        measure: &mut impl FnMut(ObjectAddress) -> Option<u64>,
    ) -> bool {
        let Some(mut flush) = self.flush.take() else {
            return true;
        };
        let end = flush.live.len().min(flush.next_live.saturating_add(max));
        for index in flush.next_live..end {
            let (object, id) = flush.live[index];
            let Some(record) = self.records.get(id.0 as usize) else {
                continue;
            };
            // Freed (and the slot perhaps reused) since begin_flush.
            if record.refs == 0 || record.object != object || record.liveness != Liveness::Live {
                continue;
            }
            let Some(size) = measure(object) else {
                self.record_free(object);
                continue;
            };
            let record = &mut self.records[id.0 as usize];
            if record.size == 0 {
                record.size = size;
            }
            let class = record.info.class;
            flush.samples.push(FlushedSample {
                stack: record.stack,
                class,
                gc_age: Some(gc_count.wrapping_sub(record.info.gc_count)),
                values: [
                    0.0,
                    0.0,
                    f64::from(record.weight),
                    f64::from(record.weight) * size as f64,
                ],
            });
            // Held for the flush: the sample's object may die (and its
            // record go) before the flush names the class.
            self.hold_class_for_flush(class);
        }
        flush.next_live = end;
        let done = end == flush.live.len();
        self.flush = Some(flush);
        done
    }

    /// Last step: the allocation samples of the detached list, and the
    /// stacks and classes every sample of the flush refers to.
    pub fn end_snapshot(
        &mut self,
        measure: &mut impl FnMut(ObjectAddress) -> Option<u64>,
    ) -> FlushSnapshot {
        let Some(flush) = self.flush.take() else {
            return FlushSnapshot::default();
        };
        let FlushInProgress {
            allocations,
            allocations_seen: seen,
            samples,
            drops,
            ..
        } = flush;
        let heap_samples = samples.len();
        let mut snapshot = FlushSnapshot {
            samples,
            drops,
            heap_samples,
            ..FlushSnapshot::default()
        };
        // Reservoir scaling: each entry stands for seen / kept samples.
        let scale = if !allocations.is_empty() && seen > allocations.len() as u64 {
            seen as f64 / allocations.len() as f64
        } else {
            1.0
        };
        for &id in allocations.iter().filter(|&&id| id != TOMBSTONE) {
            let record = &mut self.records[id.0 as usize];
            // Not measured yet (taken just now): measure while it is alive.
            if record.size == 0 && record.liveness == Liveness::Live {
                if let Some(size) = measure(record.object) {
                    record.size = size;
                }
            }
            let weight = f64::from(record.alloc_weight) * scale;
            let class = record.info.class;
            // Its record may be the class name's last holder.
            self.hold_class_for_flush(class);
            let record = &self.records[id.0 as usize];
            snapshot.samples.push(FlushedSample {
                stack: record.stack,
                class: record.info.class,
                gc_age: None,
                values: [weight, weight * record.size as f64, 0.0, 0.0],
            });
            snapshot.allocation_samples += 1;
            self.release(id);
        }

        for sample in &snapshot.samples {
            snapshot
                .stacks
                .entry(sample.stack)
                .or_insert_with(|| self.stacks.frames(sample.stack));
        }
        // All of them (per distinct frame, not per stack position; the
        // builder picks what it needs).
        snapshot.resolved_frames = self
            .stacks
            .resolved_infos()
            .map(|(frame, info)| (frame, info.clone()))
            .collect();
        let mut classes: Vec<ClassRef> = snapshot.samples.iter().map(|s| s.class).collect();
        classes.sort_unstable();
        classes.dedup();
        for &class in classes.iter().filter(|&&c| is_named_class(c)) {
            if let Some(name) = self.named_classes.name(class) {
                snapshot.resolved_classes.insert(class, name.to_string());
            }
        }
        classes.retain(|&c| !is_named_class(c));
        self.flush_classes = classes;
        snapshot
    }

    /// Gives up a flush begun and not ended (its thread was killed, or this
    /// is a forked child of a process that was flushing): its allocation
    /// samples are dropped and their records released.
    pub fn abandon_flush(&mut self) {
        if let Some(flush) = self.flush.take() {
            for id in flush.allocations {
                if id != TOMBSTONE {
                    self.release(id);
                }
            }
        }
    }

    /// After a flush has named its frames (`names`): the stacks hold those
    /// frames by name from now on instead of keeping the Ruby objects alive
    /// (see `StackTable::detach_frames`); samples of merged stacks move.
    pub fn detach_resolved_frames(&mut self, names: &FastHashMap<FrameRef, FrameInfo>) {
        self.stacks.begin_detach();
        while !self.detach_resolved_frames_batch(names, usize::MAX) {}
    }

    /// Queues the stacks to detach (`detach_resolved_frames` in batches).
    pub fn begin_detach(&mut self) {
        self.stacks.begin_detach();
    }

    /// One batch of `detach_resolved_frames`: at most `max_stacks` stacks,
    /// their samples moved in the same step. Returns whether all are done.
    pub fn detach_resolved_frames_batch(
        &mut self,
        names: &FastHashMap<FrameRef, FrameInfo>,
        max_stacks: usize,
    ) -> bool {
        let (moved, done) = self.stacks.detach_batch(names, max_stacks);
        if !moved.is_empty() {
            self.remap_stacks(&moved);
        }
        done
    }

    fn remap_stacks(&mut self, moved: &[u32]) {
        for record in self.records.iter_mut().filter(|r| r.refs > 0) {
            if let Some(stack) = moved
                .get(record.stack.index())
                .and_then(|&s| StackId::from_stored(s))
            {
                record.stack = stack;
            }
        }
    }

    /// After a flush has named its classes (`names`): samples hold those
    /// classes by name from now on (see `named_classes`).
    pub fn detach_resolved_classes(&mut self, names: &FastHashMap<ClassRef, String>) {
        // Each name is hashed once; every further record is a hold.
        let mut named: FastHashMap<ClassRef, ClassRef> = FastHashMap::default();
        for record in self.records.iter_mut().filter(|r| r.refs > 0) {
            let class = record.info.class;
            if !is_ruby_class(class) {
                continue;
            }
            let Some(name) = names.get(&class) else {
                continue;
            };
            record.info.class = match named.get(&class) {
                Some(&handle) => {
                    self.named_classes.hold(handle);
                    handle
                }
                None => {
                    let handle = self.named_classes.acquire(name);
                    named.insert(class, handle);
                    handle
                }
            };
        }
    }

    /// Classes held by name.
    pub fn named_class_count(&self) -> usize {
        self.named_classes.len()
    }

    /// Keeps a sample's class until the flush ends: a Ruby class in
    /// `flush_classes` (marked), a named one by a hold on its name.
    fn hold_class_for_flush(&mut self, class: ClassRef) {
        if is_named_class(class) {
            self.named_classes.hold(class);
            self.flush_named_holds.push(class);
        } else {
            self.flush_classes.push(class);
        }
    }

    /// Ends a flush: forgets stacks no sample uses any more.
    pub fn finish_flush(&mut self) {
        self.stacks.end_detach();
        self.abandon_flush();
        self.flush_in_progress = false;
        self.flush_classes.clear();
        for class in std::mem::take(&mut self.flush_named_holds) {
            self.named_classes.release(class);
        }
        self.stacks.prune();
    }

    pub fn flush_in_progress(&self) -> bool {
        self.flush_in_progress
    }

    /// Forgets every sample and counter (what `start!` does).
    pub fn clear(&mut self) {
        let live: Vec<ObjectAddress> = self.live.keys().copied().collect();
        for object in live {
            self.record_free(object);
        }
        for id in std::mem::take(&mut self.allocations) {
            if id != TOMBSTONE {
                self.release(id);
            }
        }
        self.allocations_seen = 0;
        self.live_keep_rate = 1.0;
        self.pending_sizes.clear();
        self.forget_watched();
        self.drops = DropCounters::default();
        self.rebuild_free_filter();
        // A flush still resolving frames prunes when it finishes.
        if !self.flush_in_progress {
            self.stacks.prune();
        }
    }

    /// In a forked child. Allocations sampled before the fork belong to the
    /// parent's next profile, so the child's first flush must not repeat
    /// them; live samples stay (the child's heap really holds those objects).
    /// The random draws are reseeded with `child_pid` so that parent and
    /// child do not sample in lockstep (still reproducible with a fixed seed).
    pub fn start_child_interval(&mut self, child_pid: u64) {
        self.forget_watched();
        for id in std::mem::take(&mut self.allocations) {
            if id != TOMBSTONE {
                self.release(id);
            }
        }
        self.allocations_seen = 0;
        self.drops = DropCounters::default();
        self.reseed(mix_seed(self.gaps.seed(), child_pid));
    }

    pub fn live_count(&self) -> usize {
        self.live.len()
    }

    /// Samples in the allocation list (not counting thinned-out ones).
    pub fn allocation_count(&self) -> usize {
        self.allocations
            .iter()
            .filter(|&&id| id != TOMBSTONE)
            .count()
    }

    pub fn drops(&self) -> DropCounters {
        self.drops
    }

    /// Classes of every sample held, and of the flush in progress: the
    /// binding layer keeps them alive. May repeat a class.
    pub fn held_classes(&self) -> impl Iterator<Item = ClassRef> + '_ {
        self.records
            .iter()
            .filter(|r| r.refs > 0)
            .map(|r| r.info.class)
            .chain(self.flush_classes.iter().copied())
    }

    /// Distinct classes of the flush in progress, to be named.
    pub fn flush_classes(&self) -> &[ClassRef] {
        &self.flush_classes
    }

    pub fn stacks(&self) -> &StackTable {
        &self.stacks
    }

    /// Approximate heap bytes used, for `ObjectSpace.memsize_of`.
    pub fn memory_bytes(&self) -> usize {
        use std::mem::size_of;
        self.stacks.memory_bytes()
            + self.records.capacity() * size_of::<SampleRecord>()
            + self.free_records.capacity() * size_of::<u32>()
            + self.live.capacity() * (size_of::<ObjectAddress>() + size_of::<SampleId>() + 8)
            + self.allocations.capacity() * size_of::<SampleId>()
            + self.pending_sizes.capacity() * size_of::<(SampleId, ObjectAddress)>()
            + self.watched.capacity() * (size_of::<ObjectAddress>() + size_of::<SampleId>() + 8)
            + self.free_filter.memory_bytes()
            + self.named_classes.memory_bytes()
    }

    fn release(&mut self, id: SampleId) {
        let record = &mut self.records[id.0 as usize];
        debug_assert!(record.refs > 0, "sample released more often than held");
        record.refs -= 1;
        if record.refs == 0 {
            let (stack, class) = (record.stack, record.info.class);
            self.stacks.release(stack);
            self.named_classes.release(class);
            self.free_records.push(id.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(ids: &[u64]) -> Vec<Frame> {
        ids.iter().map(|&frame| Frame { frame, line: 1 }).collect()
    }

    fn state(max_alloc: usize, max_heap: usize) -> SamplerState {
        SamplerState::new(GapSampler::new(1.0, 1), max_alloc, max_heap)
    }

    fn record(state: &mut SamplerState, object: ObjectAddress, stack: &[u64]) -> Option<SampleId> {
        let admission = state.admission();
        state.record_allocation(
            object,
            ObjectInfo::default(),
            &frames(stack),
            1.0,
            admission,
        )
    }

    /// Uniform draws alternating above and below 0.5: at retain rate 0.5,
    /// exactly every other sample is kept.
    fn alternating_draws() -> impl FnMut() -> f64 {
        let mut n = 0u32;
        move || {
            n += 1;
            if n % 2 == 0 {
                0.25
            } else {
                0.75
            }
        }
    }

    fn totals(snapshot: &FlushSnapshot) -> [f64; 4] {
        let mut sum = [0.0; 4];
        for sample in &snapshot.samples {
            for (s, v) in sum.iter_mut().zip(sample.values) {
                *s += v;
            }
        }
        sum
    }

    #[test]
    fn live_objects_stay_until_freed_and_allocations_reset_each_flush() {
        let mut st = state(100, 100);
        record(&mut st, 0x1000, &[8, 16]);
        record(&mut st, 0x2000, &[8, 16]);
        st.measure_pending(|_| Some(40));

        let first = st.take_snapshot(0, |_| Some(40));
        st.finish_flush();
        assert_eq!(totals(&first), [2.0, 80.0, 2.0, 80.0]);
        assert_eq!(first.allocation_samples, 2);
        assert_eq!(first.stacks.len(), 1);

        assert!(st.record_free(0x1000));
        let second = st.take_snapshot(0, |_| Some(100));
        st.finish_flush();
        assert_eq!(totals(&second), [0.0, 0.0, 1.0, 100.0]);

        assert!(st.record_free(0x2000));
        let third = st.take_snapshot(0, |_| Some(100));
        st.finish_flush();
        assert!(third.samples.is_empty());
        assert!(st.stacks().is_empty(), "unused stacks are pruned");
    }

    fn names(entries: &[(u64, &str)]) -> FastHashMap<FrameRef, FrameInfo> {
        entries
            .iter()
            .map(|&(frame, name)| {
                let info = FrameInfo {
                    name: name.to_string(),
                    filename: None,
                    start_line: 0,
                    blocks: None,
                };
                (frame, info)
            })
            .collect()
    }

    #[test]
    fn named_frames_let_go_of_ruby_objects_and_samples_follow_merged_stacks() {
        let mut st = state(100, 100);
        record(&mut st, 0x1000, &[8, 16]);
        st.measure_pending(|_| Some(40));
        let first = st.take_snapshot(0, |_| Some(40));
        st.detach_resolved_frames(&names(&[(8, "A#a"), (16, "<main>")]));
        st.finish_flush();
        assert_eq!(st.stacks().frame_count(), 0);
        // The next interval: the same path, its method entry elsewhere.
        record(&mut st, 0x2000, &[24, 16]);
        st.measure_pending(|_| Some(40));
        let second = st.take_snapshot(0, |_| Some(40));
        // Both samples are in the profile; the new one's names come from
        // the flush, the old one's from the table.
        assert_eq!(totals(&second), [1.0, 40.0, 2.0, 80.0]);
        assert_eq!(second.resolved_frames.len(), 2);
        st.detach_resolved_frames(&names(&[(24, "A#a"), (16, "<main>")]));
        st.finish_flush();
        assert_eq!(st.stacks().len(), 1, "the two stacks merged");
        assert_eq!(st.stacks().frame_count(), 0);
        // Frees release the merged stack through both samples.
        assert!(st.record_free(0x1000));
        assert!(st.record_free(0x2000));
        let third = st.take_snapshot(0, |_| Some(40));
        st.finish_flush();
        assert!(third.samples.is_empty());
        assert!(st.stacks().is_empty());
        assert_eq!(st.stacks().resolved_frame_count(), 0);
        assert_eq!(first.stacks.len(), 1);
    }

    #[test]
    fn named_classes_replace_ruby_classes_and_go_with_their_samples() {
        let mut st = state(100, 100);
        let info = ObjectInfo {
            class: 0x7000,
            ..ObjectInfo::default()
        };
        for object in [0x1000, 0x2000] {
            let admission = st.admission();
            st.record_allocation(object, info, &frames(&[8]), 1.0, admission);
        }
        st.measure_pending(|_| Some(40));
        let _ = st.take_snapshot(0, |_| Some(40));
        assert_eq!(st.flush_classes(), [0x7000]);
        let names: FastHashMap<ClassRef, String> =
            [(0x7000, "Foo".to_string())].into_iter().collect();
        st.detach_resolved_classes(&names);
        st.finish_flush();
        assert!(!st.held_classes().any(is_ruby_class), "no class kept alive");
        assert_eq!(st.named_class_count(), 1);

        // The next flush names them from the table.
        let second = st.take_snapshot(0, |_| Some(40));
        assert!(st.flush_classes().is_empty());
        assert_eq!(
            second.resolved_classes.values().collect::<Vec<_>>(),
            ["Foo"]
        );
        st.finish_flush();

        assert!(st.record_free(0x1000));
        let _ = st.take_snapshot(0, |_| Some(40));
        st.finish_flush();
        assert_eq!(st.named_class_count(), 1);
        assert!(st.record_free(0x2000));
        let _ = st.take_snapshot(0, |_| Some(40));
        st.finish_flush();
        assert_eq!(
            st.named_class_count(),
            0,
            "the name goes with its last sample"
        );
    }

    #[test]
    fn allocation_of_a_freed_object_still_counts_with_its_pending_size() {
        let mut st = state(100, 100);
        record(&mut st, 0x1000, &[8]);
        st.measure_pending(|_| Some(5_000));
        st.record_free(0x1000);
        let snap = st.take_snapshot(0, |_| panic!("no live object to measure"));
        assert_eq!(totals(&snap), [1.0, 5_000.0, 0.0, 0.0]);
    }

    #[test]
    fn caps_are_respected_and_drops_counted() {
        let mut st = state(3, 2);
        for i in 0..5 {
            record(&mut st, 0x1000 + i * 40, &[8]);
        }
        assert_eq!(st.allocation_count(), 3);
        assert!(st.live_count() <= 2);
        let drops = st.drops();
        // 2 samples beyond the allocation cap (rejected or evicting another).
        assert_eq!(drops.allocation_bufsize, 2);
        // Every sample not tracked live, or thinned out of the live map.
        assert!(drops.heap_bufsize >= 3);

        let snap = st.take_snapshot(0, |_| Some(40));
        assert_eq!(snap.drops, drops);
        assert_eq!(st.drops(), DropCounters::default(), "flush resets drops");
        assert_eq!(snap.allocation_samples, 3);
        assert!(snap.heap_samples <= 2);
        // The 3 kept allocation samples stand for all 5.
        assert!((totals(&snap)[0] - 5.0).abs() < 1e-9);
    }

    #[test]
    #[cfg_attr(miri, ignore = "statistical, no unsafe code; too slow under Miri")]
    fn a_full_live_map_thins_but_still_estimates_the_whole_live_heap() {
        let mut errors = Vec::new();
        for seed in 0..20 {
            let mut st = SamplerState::new(GapSampler::new(1.0, seed), 1_000_000, 500);
            for i in 0..20_000usize {
                let admission = st.admission();
                st.record_allocation(
                    0x1000 + i * 40,
                    ObjectInfo::default(),
                    &frames(&[8]),
                    1.0,
                    admission,
                );
                assert!(st.live_count() <= 500);
            }
            let snap = st.take_snapshot(0, |_| Some(40));
            let inuse = totals(&snap)[2];
            errors.push((inuse - 20_000.0) / 20_000.0);
        }
        let mean = errors.iter().sum::<f64>() / errors.len() as f64;
        let worst = errors.iter().fold(0.0f64, |m, e| m.max(e.abs()));
        assert!(mean.abs() < 0.03, "mean error {mean}");
        assert!(worst < 0.25, "worst error {worst}");
    }

    #[test]
    fn the_live_map_recovers_its_rate_once_objects_die() {
        let mut st = SamplerState::new(GapSampler::new(1.0, 1), 1_000_000, 100);
        for i in 0..1_000usize {
            let admission = st.admission();
            st.record_allocation(
                0x1000 + i * 40,
                ObjectInfo::default(),
                &frames(&[8]),
                1.0,
                admission,
            );
        }
        let objects: Vec<_> = st.live_objects().collect();
        for object in objects {
            st.record_free(object);
        }
        // Room again: the rate climbs back to 1 over the next samples.
        for i in 0..50usize {
            let admission = st.admission();
            st.record_allocation(
                0x9_0000 + i * 40,
                ObjectInfo::default(),
                &frames(&[8]),
                1.0,
                admission,
            );
        }
        assert!(st.live_count() >= 40, "tracked {}", st.live_count());
    }

    #[test]
    #[cfg_attr(miri, ignore = "statistical, no unsafe code; too slow under Miri")]
    fn a_full_allocation_list_keeps_a_uniform_sample_of_the_whole_interval() {
        // 1,000 early allocations from one stack, then 1,000 late ones from
        // another, through a list of 100: the late ones must not be lost.
        let mut late_share = Vec::new();
        for seed in 0..20 {
            let mut st = SamplerState::new(GapSampler::new(1.0, seed), 100, 0);
            for i in 0..2_000usize {
                let stack = if i < 1_000 { [8] } else { [16] };
                let admission = st.admission();
                st.record_allocation(
                    0x1000 + i * 40,
                    ObjectInfo::default(),
                    &frames(&stack),
                    1.0,
                    admission,
                );
            }
            let snap = st.take_snapshot(0, |_| None);
            let late: f64 = snap
                .samples
                .iter()
                .filter(|s| snap.stacks[&s.stack][0].frame == 16)
                .map(|s| s.values[0])
                .sum();
            let total: f64 = snap.samples.iter().map(|s| s.values[0]).sum();
            assert!(
                (total - 2_000.0).abs() < 1e-6,
                "estimate of the total is exact"
            );
            late_share.push(late / total);
        }
        let mean = late_share.iter().sum::<f64>() / late_share.len() as f64;
        assert!((mean - 0.5).abs() < 0.05, "late allocations' share {mean}");
    }

    #[test]
    fn thinned_samples_keep_their_reservoir_slot() {
        let mut st = state(10, 100);
        st.set_allocation_retain_rate(0.5);
        for i in 0..10 {
            record(&mut st, 0x1000 + i * 40, &[8]);
        }
        st.measure_pending_with(&mut |_| Some(40), &mut alternating_draws());
        assert_eq!(st.allocation_count(), 5);
        // The list is still full: the next sample goes through the reservoir.
        let admission = st.admission();
        assert_ne!(admission.allocation, AllocationSlot::Append);
    }

    #[test]
    fn reused_address_without_free_replaces_the_old_sample() {
        let mut st = state(100, 100);
        record(&mut st, 0x1000, &[8]);
        record(&mut st, 0x1000, &[16]);
        assert_eq!(st.live_count(), 1);
        let snap = st.take_snapshot(0, |_| Some(40));
        let live: Vec<_> = snap.samples.iter().filter(|s| s.values[2] > 0.0).collect();
        assert_eq!(live.len(), 1);
        assert_eq!(&*snap.stacks[&live[0].stack], &frames(&[16])[..]);
    }

    #[test]
    fn objects_found_invalid_at_flush_count_as_freed() {
        let mut st = state(100, 100);
        record(&mut st, 0x1000, &[8]);
        record(&mut st, 0x2000, &[8]);
        let snap = st.take_snapshot(0, |addr| (addr == 0x2000).then_some(40));
        assert_eq!(snap.heap_samples, 1);
        assert_eq!(st.live_count(), 1);
    }

    #[test]
    fn pending_sizes_skip_freed_records() {
        let mut st = state(100, 100);
        record(&mut st, 0x1000, &[8]);
        st.record_free(0x1000);
        let mut measured = 0;
        st.measure_pending(|_| {
            measured += 1;
            Some(1)
        });
        assert_eq!(measured, 0);
        assert!(!st.has_pending_sizes());
    }

    #[test]
    fn samples_outside_the_live_map_are_measured_while_their_free_is_watched() {
        let mut st = state(100, 0);
        record(&mut st, 0x1000, &[8]);
        record(&mut st, 0x2000, &[8]);
        st.record_free(0x2000); // freed before it was measured: never touched
        let mut measured = Vec::new();
        st.measure_pending(|address| {
            measured.push(address);
            Some(500)
        });
        assert_eq!(measured, vec![0x1000]);
        // Once measured they are no longer watched (nor touched again).
        let snap = st.take_snapshot(0, |_| panic!("no live object to measure"));
        assert_eq!(totals(&snap), [2.0, 500.0, 0.0, 0.0]);
    }

    #[test]
    fn thinned_out_samples_are_still_measured() {
        let mut st = SamplerState::new(GapSampler::new(1.0, 9), 1_000, 10);
        for i in 0..100 {
            record(&mut st, 0x1000 + i * 40, &[8]);
        }
        let mut measured = 0;
        st.measure_pending(|_| {
            measured += 1;
            Some(40)
        });
        assert_eq!(measured, 100, "every sample is sized, tracked or not");
        let snap = st.take_snapshot(0, |_| Some(40));
        assert!((totals(&snap)[1] - 4_000.0).abs() < 1e-6);
    }

    #[test]
    fn stop_tracking_live_forgets_addresses_but_keeps_allocations() {
        let mut st = state(100, 100);
        record(&mut st, 0x1000, &[8]);
        record(&mut st, 0x2000, &[8]);
        st.measure_pending(|_| Some(40));
        st.stop_tracking_live();
        assert_eq!(st.live_count(), 0);
        assert!(!st.record_free(0x1000));
        let snap = st.take_snapshot(0, |_| panic!("nothing is tracked"));
        assert_eq!(totals(&snap), [2.0, 80.0, 0.0, 0.0]);
    }

    #[test]
    fn relocation_moves_live_keys_and_pending_measurements() {
        let mut st = state(100, 100);
        record(&mut st, 0x1000, &[8]);
        record(&mut st, 0x2000, &[16]);
        // 0x1000 moves to 0x2000's old place and 0x2000 moves elsewhere.
        st.relocate_objects(|a| match a {
            0x1000 => 0x2000,
            0x2000 => 0x3000,
            other => other,
        });
        let mut keys: Vec<_> = st.live_objects().collect();
        keys.sort();
        assert_eq!(keys, vec![0x2000, 0x3000]);
        let mut measured = Vec::new();
        st.measure_pending(|a| {
            measured.push(a);
            Some(40)
        });
        measured.sort();
        assert_eq!(measured, vec![0x2000, 0x3000]);
        assert!(st.record_free(0x3000));
        let snap = st.take_snapshot(0, |_| Some(40));
        let live: Vec<_> = snap.samples.iter().filter(|s| s.values[2] > 0.0).collect();
        assert_eq!(live.len(), 1);
        assert_eq!(&snap.stacks[&live[0].stack][..], &frames(&[8])[..]);
    }

    #[test]
    fn allocation_retain_rate_thins_the_allocation_list_and_reweights() {
        let mut st = state(1_000, 1_000);
        st.set_allocation_retain_rate(0.5);
        for i in 0..1_000 {
            record(&mut st, 0x1000 + i * 40, &[8]);
        }
        // Alternating draws: exactly half are kept.
        st.measure_pending_with(&mut |_| Some(40), &mut alternating_draws());
        assert_eq!(st.allocation_count(), 500);
        assert_eq!(st.live_count(), 1_000, "live tracking is not thinned");
        let snap = st.take_snapshot(0, |_| Some(40));
        st.finish_flush();
        let t = totals(&snap);
        assert_eq!(t[0], 1_000.0, "kept samples count double");
        assert_eq!(t[2], 1_000.0);
    }

    #[test]
    fn stacks_are_not_pruned_while_a_flush_resolves_them() {
        let mut st = state(100, 100);
        record(&mut st, 0x1000, &[8]);
        let snap = st.take_snapshot(0, |_| Some(40));
        assert!(st.flush_in_progress());
        st.clear(); // e.g. start! from another thread mid-flush
        assert_eq!(st.stacks().live_frames().collect::<Vec<_>>(), vec![8]);
        assert_eq!(snap.stacks.len(), 1);
        st.finish_flush();
        assert!(st.stacks().is_empty());
    }

    #[test]
    fn classes_of_a_flush_stay_held_until_it_finishes() {
        let mut st = state(100, 100);
        let info = ObjectInfo {
            class: 0x5000,
            gc_count: 3,
        };
        let admission = st.admission();
        st.record_allocation(0x1000, info, &frames(&[8]), 1.0, admission);
        st.record_free(0x1000);
        let snap = st.take_snapshot(7, |_| Some(40));
        assert_eq!(snap.samples[0].class, 0x5000);
        assert!(
            st.held_classes().any(|c| c == 0x5000),
            "held while flushing"
        );
        assert_eq!(st.flush_classes(), &[0x5000]);
        st.finish_flush();
        assert!(!st.held_classes().any(|c| c == 0x5000));
    }

    #[test]
    fn live_samples_carry_their_gc_age() {
        let mut st = state(100, 100);
        let admission = st.admission();
        let info = ObjectInfo {
            class: 0x5000,
            gc_count: 3,
        };
        st.record_allocation(0x1000, info, &frames(&[8]), 1.0, admission);
        let snap = st.take_snapshot(10, |_| Some(40));
        let ages: Vec<_> = snap.samples.iter().map(|s| s.gc_age).collect();
        assert_eq!(ages, vec![Some(7), None]);
    }

    #[test]
    fn weights_scale_values() {
        let mut st = SamplerState::new(GapSampler::new(0.5, 1), 10, 10);
        let admission = st.admission();
        st.record_allocation(
            0x1000,
            ObjectInfo::default(),
            &frames(&[8]),
            100.0,
            admission,
        );
        let snap = st.take_snapshot(0, |_| Some(40));
        assert_eq!(totals(&snap), [100.0, 4_000.0, 100.0, 4_000.0]);
    }

    #[test]
    fn clear_forgets_everything() {
        let mut st = state(1, 100);
        record(&mut st, 0x1000, &[8]);
        record(&mut st, 0x2000, &[8]);
        st.clear();
        assert_eq!(st.live_count(), 0);
        assert_eq!(st.allocation_count(), 0);
        assert_eq!(st.drops(), DropCounters::default());
        assert!(st.stacks().is_empty());
        assert!(st.memory_bytes() > 0);
    }

    #[test]
    fn the_free_filter_never_hides_a_tracked_address() {
        let mut st = SamplerState::new(GapSampler::new(1.0, 3), 50, 300);
        let mut rng = SmallRng::seed_from_u64(5);
        let filter = st.free_filter();
        for round in 0..crate::test_support::miri_scaled(20_000) as u64 {
            let object = 0x10_0000 + (rng.random::<u64>() % 2_000) as usize * 40;
            match rng.random::<u32>() % 10 {
                0..=4 => {
                    record(&mut st, object, &[round % 7]);
                }
                5..=7 => {
                    st.record_free(object);
                }
                8 => st.measure_pending(|_| Some(40)),
                _ => {
                    if round % 1_000 == 9 {
                        st.relocate_objects(|a| if a % 80 == 0 { a + 8 } else { a });
                    } else if round % 5_000 == 19 {
                        st.clear();
                    } else {
                        let snapshot = st.take_snapshot(0, |_| Some(40));
                        drop(snapshot);
                        st.finish_flush();
                    }
                }
            }
            let tracked: Vec<ObjectAddress> =
                st.live.keys().chain(st.watched.keys()).copied().collect();
            assert!(
                tracked.iter().all(|&a| filter.may_contain(a)),
                "round {round}: a tracked address is missing from the filter"
            );
        }
        // Stale bits do not pile up: rebuilds keep the filter close to the
        // tracked set.
        let set_bits = (0..4_000usize)
            .map(|i| 0x10_0000 + i * 40)
            .filter(|&a| filter.may_contain(a))
            .count();
        assert!(
            set_bits <= 2 * (st.live.len() + st.watched.len()) + 1_200,
            "{set_bits}"
        );
    }

    #[test]
    fn a_sample_freed_before_its_measurement_is_sized_at_free() {
        let mut st = state(10, 10);
        record(&mut st, 0x1000, &[1]);
        record(&mut st, 0x2000, &[1]);
        assert_eq!(st.pending_count(), 2);
        assert!(st.record_free_measuring(0x1000, |_| Some(123)));
        // Without a size at free (a type not measurable there): stays 0.
        assert!(st.record_free_measuring(0x2000, |_| None));
        st.measure_pending(|_| panic!("both were freed"));
        let snapshot = st.take_snapshot(0, |_| None);
        let mut spaces: Vec<f64> = snapshot.samples.iter().map(|s| s.values[1]).collect();
        spaces.sort_by(f64::total_cmp);
        assert_eq!(spaces, vec![0.0, 123.0]);
    }

    #[test]
    fn classes_of_live_samples_stay_held_while_a_flush_walks() {
        let mut st = state(0, 10);
        let admission = st.admission();
        let info = ObjectInfo {
            class: 0x5550,
            gc_count: 0,
        };
        st.record_allocation(0x1000, info, &frames(&[1]), 1.0, admission);
        st.measure_pending(|_| Some(40));
        st.begin_flush();
        assert!(st.measure_live(0, 10, &mut |_| Some(40)));
        // The object dies before the flush names its class.
        st.record_free(0x1000);
        assert!(st.held_classes().any(|c| c == 0x5550));
        let snapshot = st.end_snapshot(&mut |_| Some(40));
        assert_eq!(snapshot.heap_samples, 1);
        st.finish_flush();
        assert!(!st.held_classes().any(|c| c == 0x5550));
    }

    #[test]
    fn a_watched_address_never_points_at_a_reused_record() {
        // Nothing enters the allocation list; the live map holds 4, so
        // thinning moves unmeasured samples to the watched map.
        let mut st = state(0, 4);
        for i in 0..5 {
            record(&mut st, 0x1000 + i * 0x100, &[i as u64]);
        }
        let watched: Vec<ObjectAddress> = st.watched.keys().copied().collect();
        for &object in &watched {
            st.record_free(object);
        }
        let live = st.live_count();
        let snapshot = st.take_snapshot(0, |_| Some(40));
        assert_eq!(snapshot.heap_samples, live);
    }

    #[test]
    fn a_sample_record_fits_in_48_bytes() {
        // Most of the collector's memory per live sample (see memory_bytes).
        assert!(std::mem::size_of::<SampleRecord>() <= 48);
    }

    #[test]
    fn a_flush_measured_in_chunks_sees_what_was_live_when_it_began() {
        let mut st = state(100, 100);
        for i in 0..10 {
            record(&mut st, 0x1000 + i * 0x100, &[i as u64]);
        }
        st.measure_pending(|_| Some(40));
        st.begin_flush();
        let mut measure = |_| Some(40);
        assert!(!st.measure_live(0, 4, &mut measure));
        // Between chunks: one object freed, one new allocation, and a
        // compaction that moves every object.
        st.record_free(0x1000 + 9 * 0x100);
        record(&mut st, 0x9000, &[99]);
        st.relocate_objects(|a| a + 8);
        while !st.measure_live(0, 4, &mut measure) {}
        let snapshot = st.end_snapshot(&mut measure);
        st.finish_flush();
        // 10 allocations of the interval; 9 or 10 live (the freed one may
        // have been measured before it died); the new one is not in it.
        assert_eq!(snapshot.allocation_samples, 10);
        assert!((9..=10).contains(&snapshot.heap_samples));
        assert_eq!(st.allocation_count(), 1);
        let next = st.take_snapshot(0, |_| Some(40));
        assert_eq!(next.allocation_samples, 1);
        assert_eq!(next.heap_samples, 10);
    }

    #[test]
    fn an_abandoned_flush_releases_its_allocation_samples() {
        let mut st = state(100, 100);
        record(&mut st, 0x1000, &[1]);
        st.record_free(0x1000);
        st.begin_flush();
        // E.g. in a forked child: the flush's thread is gone; finishing
        // releases what it held.
        st.finish_flush();
        // Nothing holds the record or its stack any more.
        assert!(st.stacks().is_empty());
        assert_eq!(st.live_count(), 0);
    }

    #[test]
    fn a_forked_child_keeps_live_samples_but_not_the_parents_allocations() {
        let mut st = SamplerState::new(GapSampler::new(0.5, 9), 1, 100);
        record(&mut st, 0x1000, &[8]);
        record(&mut st, 0x2000, &[9]); // the list is full: counted as seen
        let seed_before = st.gaps.seed();
        st.start_child_interval(4242);
        assert_ne!(st.gaps.seed(), seed_before);
        assert_eq!(st.allocation_count(), 0);
        let snapshot = st.take_snapshot(0, |_| Some(40));
        assert_eq!(snapshot.allocation_samples, 0);
        assert_eq!(snapshot.heap_samples, 2);
        assert!(snapshot.samples.iter().all(|s| s.values[0] == 0.0));
        st.finish_flush();
        // Both stacks are still held by the live samples.
        assert!(!st.stacks().is_empty());
        assert!(st.record_free(0x1000));
    }

    #[test]
    fn the_child_seed_depends_only_on_the_parent_seed_and_the_pid() {
        let child = |pid| {
            let mut st = SamplerState::new(GapSampler::new(0.5, 9), 10, 10);
            st.start_child_interval(pid);
            st.gaps.seed()
        };
        assert_eq!(child(7), child(7));
        assert_ne!(child(7), child(8));
    }

    fn rec_class(st: &mut SamplerState, object: ObjectAddress, class: ClassRef, stack: &[u64]) {
        let admission = st.admission();
        let info = ObjectInfo {
            class,
            ..ObjectInfo::default()
        };
        st.record_allocation(object, info, &frames(stack), 1.0, admission);
    }

    /// An allocation sample taken during flush K (after end_snapshot, before
    /// step 4) gets the named handle at step 4; when its object dies and the
    /// allocation list holds the last holder, end_snapshot of flush K+1
    /// releases the record before looking the name up: the name is lost.
    #[test]
    fn named_class_of_an_allocation_sample_outlives_its_last_record() {
        let mut st = state(100, 100);
        rec_class(&mut st, 0x1000, 0x7000, &[8]);
        st.measure_pending(|_| Some(40));
        let _ = st.take_snapshot(0, |_| Some(40));
        // Another thread samples an object of the same class mid-flush.
        rec_class(&mut st, 0x2000, 0x7000, &[8]);
        let names: FastHashMap<ClassRef, String> =
            [(0x7000, "Foo".to_string())].into_iter().collect();
        st.detach_resolved_classes(&names);
        st.finish_flush();
        st.measure_pending(|_| Some(40));
        assert!(st.record_free(0x1000));
        assert!(st.record_free(0x2000));
        let snap = st.take_snapshot(0, |_| Some(40));
        st.finish_flush();
        assert_eq!(snap.allocation_samples, 1);
        let class = snap.samples[0].class;
        assert!(is_named_class(class));
        assert_eq!(
            snap.resolved_classes.get(&class).map(String::as_str),
            Some("Foo"),
            "class name of the allocation sample lost"
        );
    }

    /// Live path: measured in a chunk, then the object dies (another thread
    /// ran between chunks) before end_snapshot.
    #[test]
    fn named_class_of_a_live_sample_freed_mid_flush_keeps_its_name() {
        let mut st = state(100, 100);
        rec_class(&mut st, 0x1000, 0x7000, &[8]);
        st.measure_pending(|_| Some(40));
        let _ = st.take_snapshot(0, |_| Some(40));
        let names: FastHashMap<ClassRef, String> =
            [(0x7000, "Foo".to_string())].into_iter().collect();
        st.detach_resolved_classes(&names);
        st.finish_flush();
        st.begin_flush();
        let mut m = |_: ObjectAddress| Some(40u64);
        while !st.measure_live(0, 1, &mut m) {}
        assert!(st.record_free(0x1000)); // freed while the flush yielded
        let snap = st.end_snapshot(&mut m);
        st.finish_flush();
        assert_eq!(snap.heap_samples, 1);
        let class = snap.samples[0].class;
        assert_eq!(
            snap.resolved_classes.get(&class).map(String::as_str),
            Some("Foo"),
            "class name of the live sample lost"
        );
    }

    /// Timing, not a check: `cargo test --release --lib detach_cost -- --ignored --nocapture`.
    #[test]
    #[ignore = "a timing to read, not a check"]
    fn detach_cost_on_a_large_heap() {
        use rand::RngExt;
        let mut rng = SmallRng::seed_from_u64(7);
        let paths: Vec<Vec<Frame>> = (0..4000)
            .map(|_| {
                let depth = rng.random_range(1..=100usize);
                (0..depth)
                    .map(|_| {
                        // A method appears at one of its few call sites.
                        let method = rng.random_range(0..3000u64);
                        Frame {
                            frame: 0x10000 + method * 0x40,
                            line: (method % 400) as i32 + rng.random_range(0..3),
                        }
                    })
                    .collect()
            })
            .collect();
        let mut st = state(1_000_000, 1_000_000);
        for i in 0..50_000usize {
            let p = &paths[rng.random_range(0..paths.len())];
            let admission = st.admission();
            let info = ObjectInfo {
                class: 0x100000 + (i as u64 % 2000) * 0x28,
                ..ObjectInfo::default()
            };
            st.record_allocation(0x1000_0000 + i * 40, info, p, 1.0, admission);
        }
        st.measure_pending(|_| Some(40));
        let t = std::time::Instant::now();
        let snap = st.take_snapshot(0, |_| Some(40));
        eprintln!(
            "take_snapshot (first) {:?}, stacks {}",
            t.elapsed(),
            snap.stacks.len()
        );
        let names: FastHashMap<FrameRef, FrameInfo> = (0..3000u64)
            .map(|m| {
                (
                    0x10000 + m * 0x40,
                    FrameInfo {
                        name: format!("BenchWorkloads::Scenario::Calls.method_{m}"),
                        filename: Some("/work/main/bench/lib/workloads.rb".to_string()),
                        start_line: m as i64,
                        blocks: None,
                    },
                )
            })
            .collect();
        let classes: FastHashMap<ClassRef, String> = (0..2000u64)
            .map(|c| {
                (
                    0x100000 + c * 0x28,
                    format!("BenchWorkloads::Scenario::Class{c}"),
                )
            })
            .collect();
        let t = std::time::Instant::now();
        st.detach_resolved_frames(&names);
        eprintln!("detach_resolved_frames {:?}", t.elapsed());
        let t = std::time::Instant::now();
        st.detach_resolved_classes(&classes);
        eprintln!("detach_resolved_classes {:?}", t.elapsed());
        let t = std::time::Instant::now();
        st.finish_flush();
        eprintln!("finish_flush {:?}", t.elapsed());
        let t = std::time::Instant::now();
        let snap = st.take_snapshot(0, |_| Some(40));
        eprintln!(
            "take_snapshot (second) {:?} resolved {}",
            t.elapsed(),
            snap.resolved_frames.len()
        );
        st.detach_resolved_frames(&FastHashMap::default());
        st.finish_flush();
        // Steady state: one interval's 10,000 new samples over the same paths.
        for i in 0..10_000usize {
            let p = &paths[rng.random_range(0..paths.len())];
            let admission = st.admission();
            let info = ObjectInfo {
                class: 0x100000 + (i as u64 % 2000) * 0x28,
                ..ObjectInfo::default()
            };
            st.record_allocation(0x2000_0000 + i * 40, info, p, 1.0, admission);
        }
        st.measure_pending(|_| Some(40));
        st.begin_flush();
        let mut m = |_: ObjectAddress| Some(40u64);
        while !st.measure_live(0, usize::MAX, &mut m) {}
        let t = std::time::Instant::now();
        let snap = st.end_snapshot(&mut m);
        eprintln!(
            "end_snapshot (steady) {:?} stacks {} resolved {}",
            t.elapsed(),
            snap.stacks.len(),
            snap.resolved_frames.len()
        );
        let t = std::time::Instant::now();
        st.detach_resolved_frames(&names);
        eprintln!(
            "detach_resolved_frames (steady, 10k new samples) {:?}, stacks now {}",
            t.elapsed(),
            st.stacks().len()
        );
        st.finish_flush();
    }

    /// Random interleavings of samples, frees, flushes (with frames sampled
    /// "during" the flush left unnamed), detaches and prunes: every live
    /// sample keeps its original names, refcounts stay consistent.
    /// For the fuzz test: samples a new object with `stack`; if it is
    /// tracked live, remembers the frame names its profile must show.
    fn sample_expecting(
        st: &mut SamplerState,
        next_obj: &mut ObjectAddress,
        expected: &mut FastHashMap<ObjectAddress, Vec<(String, i32)>>,
        stack: &[Frame],
        name: impl Fn(u64) -> String,
    ) {
        let admission = st.admission();
        let obj = *next_obj;
        *next_obj += 40;
        if st
            .record_allocation(obj, ObjectInfo::default(), stack, 1.0, admission)
            .is_some()
            && admission.live
        {
            expected.insert(obj, stack.iter().map(|f| (name(f.frame), f.line)).collect());
        }
    }

    #[test]
    #[cfg_attr(miri, ignore = "200 random runs; too slow under Miri")]
    fn random_flushes_and_detaches_keep_names_and_refcounts() {
        use rand::RngExt;
        for seed in 0..200u64 {
            let mut rng = SmallRng::seed_from_u64(seed);
            let mut st = state(1_000, 1_000);
            // Ruby frame value -> name; values get "reused" for other names
            // only once no stack holds them (like a freed iseq).
            let name_of = |v: u64, gen: &FastHashMap<u64, u32>| {
                format!("m{}g{}", v, gen.get(&v).copied().unwrap_or(0))
            };
            let mut gen: FastHashMap<u64, u32> = FastHashMap::default();
            let mut expected: FastHashMap<ObjectAddress, Vec<(String, i32)>> =
                FastHashMap::default();
            let mut next_obj = 0x1000usize;
            for _round in 0..30 {
                for _ in 0..rng.random_range(0..20) {
                    let depth = rng.random_range(0..5usize);
                    let stack: Vec<Frame> = (0..depth)
                        .map(|_| Frame {
                            frame: 8 * rng.random_range(1..6u64),
                            line: rng.random_range(1..3),
                        })
                        .collect();
                    sample_expecting(&mut st, &mut next_obj, &mut expected, &stack, |f| {
                        name_of(f, &gen)
                    });
                }
                st.measure_pending(|_| Some(8));
                let objs: Vec<_> = expected.keys().copied().collect();
                for o in objs {
                    if rng.random_bool(0.3) {
                        st.record_free(o);
                        expected.remove(&o);
                    }
                }
                let snap = st.take_snapshot(0, |_| Some(8));
                // Check every live sample's names.
                let mut got: Vec<Vec<(String, i32)>> = snap
                    .samples
                    .iter()
                    .filter(|s| s.gc_age.is_some())
                    .map(|s| {
                        snap.stacks[&s.stack]
                            .iter()
                            .map(|f| {
                                let n = match snap.resolved_frames.get(&f.frame) {
                                    Some(info) => info.name.clone(),
                                    None => {
                                        assert!(!is_resolved_frame_(f.frame));
                                        name_of(f.frame, &gen)
                                    }
                                };
                                (n, f.line)
                            })
                            .collect()
                    })
                    .collect();
                let mut want: Vec<Vec<(String, i32)>> = expected.values().cloned().collect();
                got.sort();
                want.sort();
                assert_eq!(got, want, "seed {seed}");
                // Names of the snapshot's Ruby frames, as resolve_frames would.
                let mut names: FastHashMap<FrameRef, FrameInfo> = FastHashMap::default();
                for frames in snap.stacks.values() {
                    for f in frames.iter() {
                        if !is_resolved_frame_(f.frame) {
                            names.insert(
                                f.frame,
                                FrameInfo {
                                    name: name_of(f.frame, &gen),
                                    filename: None,
                                    start_line: 0,
                                    blocks: None,
                                },
                            );
                        }
                    }
                }
                // Samples taken while the flush ran (not named).
                for _ in 0..rng.random_range(0..4) {
                    let stack: Vec<Frame> = (0..rng.random_range(1..4usize))
                        .map(|_| Frame {
                            frame: 8 * rng.random_range(1..8u64),
                            line: 1,
                        })
                        .collect();
                    sample_expecting(&mut st, &mut next_obj, &mut expected, &stack, |f| {
                        name_of(f, &gen)
                    });
                }
                if rng.random_bool(0.8) {
                    // In batches, other threads sampling in between, and
                    // frame values no stack holds any more being reused
                    // for other code meanwhile.
                    st.begin_detach();
                    while !st.detach_resolved_frames_batch(&names, rng.random_range(1..4)) {
                        for _ in 0..rng.random_range(0..3) {
                            let stack: Vec<Frame> = (0..rng.random_range(1..4usize))
                                .map(|_| Frame {
                                    frame: 8 * rng.random_range(1..8u64),
                                    line: 1,
                                })
                                .collect();
                            sample_expecting(&mut st, &mut next_obj, &mut expected, &stack, |f| {
                                name_of(f, &gen)
                            });
                        }
                        let live: std::collections::HashSet<u64> =
                            st.stacks().live_frames().collect();
                        for v in 1..8u64 {
                            if !live.contains(&(8 * v)) && rng.random_bool(0.3) {
                                *gen.entry(8 * v).or_insert(0) += 1;
                            }
                        }
                    }
                }
                st.finish_flush();
                // Frame values no stack holds may be reused for other code.
                let live: std::collections::HashSet<u64> = st.stacks().live_frames().collect();
                for v in 1..8u64 {
                    if !live.contains(&(8 * v)) && rng.random_bool(0.5) {
                        *gen.entry(8 * v).or_insert(0) += 1;
                    }
                }
            }
            for o in expected.keys().copied().collect::<Vec<_>>() {
                st.record_free(o);
            }
            let _ = st.take_snapshot(0, |_| Some(8));
            st.finish_flush();
            assert!(st.stacks().is_empty(), "seed {seed}");
            assert_eq!(st.stacks().resolved_frame_count(), 0, "seed {seed}");
            assert_eq!(st.stacks().frame_count(), 0, "seed {seed}");
        }
    }
    fn is_resolved_frame_(f: u64) -> bool {
        crate::sampler::types::is_resolved_frame(f)
    }
}
