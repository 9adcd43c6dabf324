//! Everything the collector remembers between flushes: the sampled
//! allocations of the current interval (the allocation list), the sampled
//! objects still alive (the live-object map) and their deduplicated stacks.
//!
//! One `SampleRecord` is shared by the allocation list and the live map and
//! refcounted by them, so an object allocated in this interval and still alive
//! costs one record. Nothing here calls into Ruby; the binding layer passes
//! object addresses in and measures sizes through callbacks.
//!
//! The state's methods are grouped by what they serve:
//! - `admission`: where a new sample goes under the caps, and recording
//!   allocations and frees (called from the NEWOBJ and FREEOBJ hooks);
//! - `measure`: sizing new samples once their objects are filled in, and
//!   following objects that GC compaction moved;
//! - `flush`: reading a profile out in steps (its call order is at the top
//!   of flush.rs, enforced by the step tokens);
//! - `detach`: after a flush, holding the frames and classes it named by
//!   name instead of as Ruby objects.

use live_map::LiveMap;
use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::SeedableRng;

use super::address_filter::{AddressFilter, DEFAULT_BUCKETS_LOG2};
use super::gaps::{mix_seed, GapSampler};
use super::label_sets::{LabelSetId, NO_LABELS};
use super::named_classes::NamedClasses;
use super::reservoir::Reservoir;
use super::stack_table::{StackId, StackTable};
use super::types::{ClassRef, ObjectAddress};
use crate::fast_hash::FastHashMap;

mod admission;
#[cfg(test)]
mod chunked_flush_tests;
mod detach;
mod flush;
mod held_interval;
#[cfg(test)]
mod held_interval_tests;
mod live_map;
mod liveness;
#[cfg(test)]
mod liveness_tests;
mod measure;
#[cfg(test)]
mod tests;

pub use admission::{Admission, AllocationSlot};
pub use flush::{Detaching, FlushSnapshot, FlushedSample, InuseCutoff, Measuring, Naming};

use flush::FlushPhase;

/// What the binding layer knows about an object when it is sampled.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ObjectInfo {
    pub class: ClassRef,
    /// Number of GCs so far (`GC.count`), to tell the object's age later.
    pub gc_count: u32,
    /// The sampling window it was taken in (its block's id, wrapping at
    /// 2^16), and that window's probability as a bfloat16: how sure an
    /// estimate is depends on them (sampler/spread.rs).
    window: u16,
    window_probability: u16,
    /// The labels (request, job) current when it was allocated.
    pub labels: LabelSetId,
}

impl ObjectInfo {
    pub fn new(class: ClassRef, gc_count: u32) -> Self {
        ObjectInfo {
            class,
            gc_count,
            ..ObjectInfo::default()
        }
    }

    pub fn set_window(&mut self, window: u32, probability: f64) {
        self.window = window as u16;
        self.window_probability = ((probability as f32).to_bits() >> 16) as u16;
    }

    pub fn window(&self) -> u32 {
        u32::from(self.window)
    }

    /// To about 3 significant digits (1.0 exactly).
    pub fn window_probability(&self) -> f32 {
        f32::from_bits(u32::from(self.window_probability) << 16)
    }
}

impl Default for ObjectInfo {
    fn default() -> Self {
        ObjectInfo {
            class: ClassRef(0),
            gc_count: 0,
            window: 0,
            window_probability: (1.0f32.to_bits() >> 16) as u16,
            labels: NO_LABELS,
        }
    }
}

/// A tracked live sample, as `SamplerState::live_samples` lists it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LiveSample {
    pub object: ObjectAddress,
    pub stack: StackId,
    /// How many live objects it stands for.
    pub weight: f64,
    /// Bytes, as last measured (0 until measured).
    pub size: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SampleId(u32);

impl SampleId {
    /// A plain number for the sample (its record's slot), to key it in maps
    /// outside the state.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

#[derive(Debug, Clone)]
struct SampleRecord {
    stack: StackId,
    /// `ObjectInfo`'s fields, flat so that the record's small fields pack
    /// together: the record is most of the collector's memory per sample.
    class: ClassRef,
    gc_count: u32,
    window: u16,
    window_probability: u16,
    /// A `LabelSetId` (label_sets keeps them below 2^16).
    labels: u16,
    /// How many live objects this sample stands for (1 / rate when taken).
    /// f32 (7 significant digits) keeps the record at 48 bytes.
    weight: f32,
    /// How many allocations it stands for in the allocation profile: weight
    /// divided by allocation_retain_rate once it survives that thinning.
    alloc_weight: f32,
    /// Bytes, as last measured; 0 until the first measurement.
    size: u64,
    /// The sampled object's address (stale once the object is freed).
    object: ObjectAddress,
    /// Held by the allocation list and/or the live or watched map (which
    /// stops a watched address from pointing at a reused record); 0 = the
    /// slot is free.
    refs: u8,
    marks: Marks,
}

impl SampleRecord {
    fn info(&self) -> ObjectInfo {
        ObjectInfo {
            class: self.class,
            gc_count: self.gc_count,
            window: self.window,
            window_probability: self.window_probability,
            labels: LabelSetId(u32::from(self.labels)),
        }
    }
}

/// A record's liveness and two flags in one byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Marks(u8);

impl Marks {
    const LIVENESS: u8 = 0b11;
    /// Left the allocation list early (allocation_retain_rate thinning).
    const ALLOC_DROPPED: u8 = 0b100;
    /// Taken while a flush walks the records for live samples: not one of
    /// that flush's (listed in `taken_in_walk`, cleared when it ends).
    const TAKEN_IN_WALK: u8 = 0b1000;
    /// An allocation sample a flush read while nothing else held it: it gave
    /// its stack up, so that the flush's detach passes the stack by, and
    /// takes it back if the flush gives the sample back (held_interval.rs).
    const PARKED: u8 = 0b1_0000;

    fn new(liveness: Liveness, taken_in_walk: bool) -> Self {
        let mut marks = Marks(0);
        marks.set_liveness(liveness);
        marks.set(Marks::TAKEN_IN_WALK, taken_in_walk);
        marks
    }

    fn liveness(self) -> Liveness {
        match self.0 & Marks::LIVENESS {
            0 => Liveness::Live,
            1 => Liveness::Freed,
            2 => Liveness::Watched,
            _ => Liveness::Untracked,
        }
    }

    fn set_liveness(&mut self, liveness: Liveness) {
        self.0 = (self.0 & !Marks::LIVENESS) | liveness as u8;
    }

    fn alloc_dropped(self) -> bool {
        self.0 & Marks::ALLOC_DROPPED != 0
    }

    fn taken_in_walk(self) -> bool {
        self.0 & Marks::TAKEN_IN_WALK != 0
    }

    fn parked(self) -> bool {
        self.0 & Marks::PARKED != 0
    }

    fn set(&mut self, mark: u8, on: bool) {
        if on {
            self.0 |= mark;
        } else {
            self.0 &= !mark;
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Liveness {
    /// In the live map: not seen freed yet.
    Live = 0,
    /// Was in the live map; its object has been freed.
    Freed = 1,
    /// Not in the live map, but its free is watched until it is measured
    /// (so the measurement never touches a freed object).
    Watched = 2,
    /// Not tracked: whether it lives is unknown.
    Untracked = 3,
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

/// An allocation-list entry whose sample was thinned out by
/// allocation_retain_rate: it keeps its reservoir slot (so the reservoir's
/// odds stay right) but contributes nothing.
const TOMBSTONE: SampleId = SampleId(u32::MAX);

/// Room reserved for samples waiting to be measured: the binding asks for
/// a job at 32 (ruby/collector/sampling.rs), and more come while it waits.
const PENDING_RESERVE: usize = 128;

#[derive(Debug)]
pub struct SamplerState {
    stacks: StackTable,
    records: Vec<SampleRecord>,
    free_records: Vec<u32>,
    live: LiveMap,
    /// Records taken while a flush measures (see `SampleRecord`).
    taken_in_walk: Vec<SampleId>,
    /// The allocation list: at most max_allocation_samples of this
    /// interval's samples, chosen by `reservoir`.
    allocations: Vec<SampleId>,
    /// The priorities of the allocation list's slots.
    reservoir: Reservoir,
    /// What the flush in progress took from its interval (held_interval.rs).
    held: Option<held_interval::HeldInterval>,
    /// Allocation samples flushes that did not deliver gave back, for the
    /// next flush (weights final).
    returned: Vec<SampleId>,
    /// Allocation samples of delivered flushes, to release.
    delivered: Vec<SampleId>,
    /// The threshold new samples are tracked live under (threshold.rs; 0:
    /// every one): set each time the map fills and is thinned, halved
    /// while it has room again.
    live_threshold: f64,
    /// The live weights, while thinning (kept to reuse its memory).
    threshold_scratch: Vec<f32>,
    /// A thinning of the live map under way (admission.rs): the record it
    /// goes on from at the next sample.
    thinning_from: Option<usize>,
    /// Samples taken but not yet measured (sizes are known only once the
    /// allocating method has filled the object in). Pushed to in the
    /// NEWOBJ hook, so it starts with room for the batches a job measures
    /// (`PENDING_RESERVE`) and keeps its capacity: the hook does not
    /// allocate for it but past that.
    pending_sizes: Vec<(SampleId, ObjectAddress)>,
    /// Objects of pending samples that are not in the live map, watched for
    /// their free until measured.
    watched: FastHashMap<ObjectAddress, SampleId>,
    pub gaps: GapSampler,
    pub max_allocation_samples: usize,
    pub max_heap_samples: usize,
    /// Fraction of measured samples kept in the allocation profile.
    allocation_retain_rate: f64,
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
    /// Where the flush being read out in steps is (flush.rs).
    phase: FlushPhase,
    /// Detaching: samples of merged stacks moved up to this record (None
    /// until every stack is detached; see detach.rs).
    remap_from: Option<usize>,
    /// Detaching: the classes the flush named, for the records to take.
    detach_class_names: FastHashMap<ClassRef, String>,
    /// Deaths are found through object ids, not the FREEOBJ hook
    /// (liveness.rs).
    lazy_liveness: bool,
    /// Lazy liveness: each record's object id (0: none yet), by SampleId.
    object_ids: Vec<u64>,
    /// Lazy liveness: the live map's size at which to look for dead samples.
    next_prune_at: usize,
    /// Lazy liveness: tracked samples whose address compaction made
    /// unknown, until their ids are looked up again.
    unresolved: Vec<SampleId>,
    /// Lazy liveness: compactions seen (see `compactions`).
    compactions: u64,
    /// Lazy liveness: the GC count at the last prune of the whole live map.
    all_verified_at: Option<u32>,
}

impl SamplerState {
    pub fn new(gaps: GapSampler, max_allocation_samples: usize, max_heap_samples: usize) -> Self {
        let retain_seed = gaps.seed().wrapping_add(1);
        SamplerState {
            stacks: StackTable::new(),
            remap_from: None,
            detach_class_names: FastHashMap::default(),
            named_classes: NamedClasses::default(),
            flush_named_holds: Vec::new(),
            records: Vec::new(),
            free_records: Vec::new(),
            live: LiveMap::default(),
            taken_in_walk: Vec::new(),
            allocations: Vec::new(),
            reservoir: Reservoir::default(),
            held: None,
            returned: Vec::new(),
            delivered: Vec::new(),
            live_threshold: 0.0,
            threshold_scratch: Vec::new(),
            thinning_from: None,
            pending_sizes: Vec::with_capacity(PENDING_RESERVE),
            watched: FastHashMap::default(),
            gaps,
            max_allocation_samples,
            max_heap_samples,
            allocation_retain_rate: 1.0,
            retain_rng: SmallRng::seed_from_u64(retain_seed),
            flush_classes: Vec::new(),
            drops: DropCounters::default(),
            free_filter: Arc::new(AddressFilter::new(DEFAULT_BUCKETS_LOG2)),
            phase: FlushPhase::Idle,
            lazy_liveness: false,
            object_ids: Vec::new(),
            next_prune_at: 0,
            unresolved: Vec::new(),
            compactions: 0,
            all_verified_at: None,
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

    /// Forgets every sample and counter (what `start!` does).
    pub fn clear(&mut self) {
        let live: Vec<ObjectAddress> = self.live.keys().copied().collect();
        for object in live {
            self.record_free(object);
        }
        self.forget_unresolved();
        for id in std::mem::take(&mut self.allocations) {
            if id != TOMBSTONE {
                self.release(id);
            }
        }
        self.reservoir.clear();
        self.release_returned_and_delivered();
        self.discard_held();
        self.live_threshold = 0.0;
        self.thinning_from = None;
        self.pending_sizes.clear();
        self.forget_watched();
        self.drops = DropCounters::default();
        self.rebuild_free_filter();
        // A flush still resolving frames prunes when it finishes.
        if !self.flush_in_progress() {
            // No sample is left to hold a merged stack's id (end_flush).
            debug_assert!(
                !self.stacks.is_forwarding() || self.records.iter().all(|r| r.refs == 0),
                "a sample outlived clear"
            );
            self.stacks.end_forwarding();
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
        self.reservoir.clear();
        self.release_returned_and_delivered();
        self.drops = DropCounters::default();
        self.reseed(mix_seed(self.gaps.seed(), child_pid));
    }

    /// Tracked live samples (with those whose address a compaction made
    /// unknown in lazy mode).
    pub fn live_count(&self) -> usize {
        self.live.len() + self.unresolved.len()
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
            .map(|r| r.class)
            .chain(self.flush_classes.iter().copied())
    }

    /// Every tracked (live) object's address, e.g. to check after a GC.
    pub fn live_objects(&self) -> impl Iterator<Item = ObjectAddress> + '_ {
        self.live.keys().copied()
    }

    /// Every tracked live sample: its object, the stack that allocated it,
    /// how many objects it stands for, and its size as last measured (0
    /// until measured). For a retention report's choice of sites.
    pub fn live_samples(&self) -> impl Iterator<Item = LiveSample> + '_ {
        self.live.iter().map(|(&object, &id)| {
            let record = &self.records[id.index()];
            LiveSample {
                object,
                stack: self.stacks.forwarded(record.stack),
                weight: f64::from(record.weight),
                size: record.size,
            }
        })
    }

    #[cfg(test)]
    pub fn has_pending_sizes(&self) -> bool {
        !self.pending_sizes.is_empty()
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
            + self.taken_in_walk.capacity() * size_of::<SampleId>()
            + self.live.capacity() * (size_of::<ObjectAddress>() + size_of::<SampleId>() + 8)
            + (self.allocations.capacity()
                + self.held.as_ref().map_or(0, |h| h.len())
                + self.returned.capacity()
                + self.delivered.capacity())
                * size_of::<SampleId>()
            + self.reservoir.memory_bytes()
            + self.pending_sizes.capacity() * size_of::<(SampleId, ObjectAddress)>()
            + self.watched.capacity() * (size_of::<ObjectAddress>() + size_of::<SampleId>() + 8)
            + self.free_filter.memory_bytes()
            + self.named_classes.memory_bytes()
            + self.object_ids.capacity() * size_of::<u64>()
            + self.unresolved.capacity() * size_of::<SampleId>()
    }

    fn release(&mut self, id: SampleId) {
        let record = &mut self.records[id.0 as usize];
        debug_assert!(record.refs > 0, "sample released more often than held");
        record.refs -= 1;
        if record.refs == 0 {
            let (stack, class) = (record.stack, record.class);
            if !record.marks.parked() {
                self.stacks.release(stack);
            }
            self.named_classes.release(class);
            self.free_records.push(id.0);
        }
    }
}
