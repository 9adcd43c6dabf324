//! A flush reads the state out in steps. The binding layer releases the
//! lock between them, so that other threads run during a long flush and
//! the naming step can call Ruby. The call order, one phase per line:
//!
//! ```text
//! begin_flush() -> Measuring          detach the allocation list, list live objects
//!   measure_live(&Measuring, ..)      size live objects in chunks; true when done
//!   read_allocations(&Measuring, ..)  then the allocation list, in chunks; true when done
//! end_snapshot(Measuring, ..) -> (FlushSnapshot, Naming)
//!   copy_stacks(&Naming, ..)          (after end_snapshot_samples) in chunks; true when done
//!   flush_classes()                   Ruby classes to name (held until the end)
//!   .. the binding layer names frames and classes and builds the profile ..
//! begin_detach(Naming, &classes) -> Detaching          (detach.rs)
//!   detach_frames_batch(&Detaching, &frames, max)      in batches; true when done
//! finish_flush(Detaching)             the profile is delivered: release the
//!                                     interval's samples (held_interval.rs)
//! ```
//!
//! Each step takes the token of the step before (by value when it ends a
//! phase), and only this module makes tokens, so steps cannot be called out
//! of order. `end_flush` ends a flush in any phase: an error or a killed
//! thread in the middle, or a forked child of a process that was flushing;
//! a flush ended so gives its interval's samples back to the next.
//! The phase is kept in the state too (`FlushPhase`): GC compaction must
//! re-address the objects still to be measured, and `clear` must not prune
//! stacks whose frames a flush is still naming.

use std::sync::Arc;

use super::{DropCounters, Liveness, Marks, SampleId, SamplerState, TOMBSTONE};
use crate::fast_hash::{FastHashMap, FastHashSet};
use crate::label_sets::LabelSetId;
use crate::stack_table::{Frame, FrameInfo, StackId};
use crate::types::{is_named_class, ClassRef, FrameRef, ObjectAddress};

/// Stacks that fell unused during a flush removed as it ends (the rest in
/// chunks by `prune_unused`, or by the next flush if this one was cut
/// short).
const END_FLUSH_PRUNE: usize = 1_024;

/// Proof that a flush is measuring live objects (from `begin_flush`).
#[must_use = "a flush goes on with end_snapshot, or ends with end_flush"]
#[derive(Debug)]
pub struct Measuring(());

/// Proof that a flush has its snapshot and is naming frames and classes.
#[must_use = "a flush goes on with begin_detach, or ends with end_flush"]
#[derive(Debug)]
pub struct Naming(());

/// Proof that a flush is detaching named frames (from `begin_detach`).
#[must_use = "a flush ends with finish_flush, or end_flush"]
#[derive(Debug)]
pub struct Detaching(());

impl Naming {
    fn new() -> Self {
        Naming(())
    }
}

impl Detaching {
    pub(super) fn new() -> Self {
        Detaching(())
    }
}

/// Where the flush is, if one is running.
#[derive(Debug, Default)]
pub(super) enum FlushPhase {
    #[default]
    Idle,
    /// `begin_flush` .. `end_snapshot`.
    Measuring(FlushInProgress),
    /// `end_snapshot` .. `begin_detach`: the flush's classes are held
    /// (`flush_classes`) and no stack may be pruned.
    Naming,
    /// `begin_detach` .. `finish_flush`.
    Detaching,
}

/// Which live samples a flush counts in use: those whose object has been
/// through `min_age` GCs since its allocation (`gc_count` is Ruby's GC
/// count now). 1 (no GC under way) or 2 (one marking or sweeping) counts
/// what was alive at the last completed GC: an object allocated since is
/// not known to be alive yet, and most of those are garbage. 0 counts every
/// sample still tracked at the flush.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InuseCutoff {
    pub gc_count: u32,
    pub min_age: u32,
}

impl InuseCutoff {
    /// Every sample still tracked.
    pub fn at_flush(gc_count: u32) -> Self {
        InuseCutoff {
            gc_count,
            min_age: 0,
        }
    }

    /// What survived the last completed GC: `gc_under_way` when a GC has
    /// started (counted) and not finished marking and sweeping.
    pub fn last_completed_gc(gc_count: u32, gc_under_way: bool) -> Self {
        InuseCutoff {
            gc_count,
            min_age: if gc_under_way { 2 } else { 1 },
        }
    }

    fn age(self, allocated_at: u32) -> u32 {
        self.gc_count.wrapping_sub(allocated_at)
    }
}

/// One sample's contribution to a flushed profile, already weighted:
/// [alloc_objects, alloc_space, inuse_objects, inuse_space].
#[derive(Debug, Clone, PartialEq)]
pub struct FlushedSample {
    pub stack: StackId,
    pub class: ClassRef,
    /// For live objects: how many GCs they have survived.
    pub gc_age: Option<u32>,
    pub values: [f64; 4],
    /// The sampling window it was taken in (wrapping at 2^16), and that
    /// window's probability: what its spread depends on (sampler/spread.rs).
    pub window: u32,
    pub window_probability: f32,
    pub labels: LabelSetId,
}

/// A flush between `begin_flush` and `end_snapshot`. Kept inside the state
/// so that GC compaction can re-address it and a forked child (or any other
/// end of the flush) can release what it holds.
#[derive(Debug)]
pub(super) struct FlushInProgress {
    /// Live samples are found by walking the records, `next_live..live_end`
    /// (the records when the flush began), a chunk at a time: copying the
    /// live map took one hold of the GVL as long as the map (~12 ms at a
    /// million). A sample is measured if it is live when its turn comes.
    pub(super) next_live: usize,
    pub(super) live_end: usize,
    /// The held interval's allocation samples (held_interval.rs) are read
    /// `next_allocation..` onwards.
    next_allocation: usize,
    /// Live samples, then allocation samples (`heap_samples` of the first).
    samples: Vec<FlushedSample>,
    heap_samples: Option<usize>,
    allocation_samples: usize,
    /// The classes `samples` refer to.
    classes: FastHashSet<ClassRef>,
    /// Live samples left out by the flush's `InuseCutoff`.
    too_young: usize,
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
    /// `samples` whose stacks `copy_stacks` has looked at.
    stacks_copied: usize,
    pub allocation_samples: usize,
    pub heap_samples: usize,
    pub drops: DropCounters,
    /// Live samples left out of in-use: allocated since the last completed
    /// GC (see `InuseCutoff`).
    pub too_young: usize,
}

impl SamplerState {
    /// First step of a flush: takes the interval's allocation samples
    /// (allocations from now on belong to the next flush; see
    /// held_interval.rs for what becomes of them) and lists the live objects
    /// to measure. Cheap, so the caller can then measure them in chunks with
    /// `measure_live`, letting other threads run in between. A flush left
    /// unfinished is ended first.
    pub fn begin_flush(&mut self) -> Measuring {
        if self.flush_in_progress() {
            self.end_flush();
        }
        // What the caller has not released in chunks (`release_delivered`).
        self.release_delivered(usize::MAX);
        self.pending_sizes.clear();
        self.forget_watched();
        self.flush_classes.clear();
        self.stacks.hold_pruning();
        // Room for every sample now: growing a vector of a million samples
        // copies tens of megabytes in one hold of the GVL.
        let held = self.take_interval();
        let samples = Vec::with_capacity(self.live.len() + held.len());
        self.held = Some(held);
        self.phase = FlushPhase::Measuring(FlushInProgress {
            next_live: 0,
            live_end: self.records.len(),
            next_allocation: 0,
            samples,
            heap_samples: None,
            allocation_samples: 0,
            classes: FastHashSet::default(),
            too_young: 0,
        });
        Measuring(())
    }

    /// The object of record `index` if it is a live sample now (its
    /// address known: 0 is one lazy liveness lost to a compaction) that
    /// was taken before the flush began (one taken since, in a freed
    /// record's slot, is the next flush's, and may not be measured yet).
    pub(super) fn live_object(&self, index: usize) -> Option<ObjectAddress> {
        let record = self.records.get(index)?;
        let live = record.refs > 0
            && record.marks.liveness() == Liveness::Live
            && record.object != ObjectAddress::NONE
            && !record.marks.taken_in_walk();
        (live && self.live.get(&record.object) == Some(&SampleId(index as u32)))
            .then_some(record.object)
    }

    /// Measures up to `max` of the flush's live objects (those freed since
    /// `begin_flush` are skipped; those `measure` finds invalid are counted
    /// as freed; those younger than `cutoff` are left out, still tracked).
    /// Returns true when all are done (or no flush is begun).
    pub fn measure_live(
        &mut self,
        _measuring: &Measuring,
        cutoff: InuseCutoff,
        max: usize,
        measure: &mut impl FnMut(ObjectAddress) -> Option<u64>,
    ) -> bool {
        let mut flush = match std::mem::replace(&mut self.phase, FlushPhase::Idle) {
            FlushPhase::Measuring(flush) => flush,
            other => {
                debug_assert!(false, "measure_live outside the measuring phase");
                self.phase = other;
                return true;
            }
        };
        let end = flush.live_end.min(flush.next_live.saturating_add(max));
        for index in flush.next_live..end {
            let Some(object) = self.live_object(index) else {
                continue;
            };
            let id = SampleId(index as u32);
            let gc_age = cutoff.age(self.records[index].info().gc_count);
            if gc_age < cutoff.min_age {
                flush.too_young += 1;
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
            let class = record.class;
            flush.classes.insert(class);
            flush.samples.push(FlushedSample {
                stack: self.stacks.forwarded(record.stack),
                class,
                gc_age: Some(gc_age),
                values: [
                    0.0,
                    0.0,
                    f64::from(record.weight),
                    f64::from(record.weight) * size as f64,
                ],
                window: record.info().window(),
                window_probability: record.info().window_probability(),
                labels: record.info().labels,
            });
            // Held for the flush: the sample's object may die (and its
            // record go) before the flush names the class.
            self.hold_class_for_flush(class);
        }
        flush.next_live = end;
        let done = end == flush.live_end;
        self.phase = FlushPhase::Measuring(flush);
        done
    }

    /// Second step: the allocation samples of the detached list, and the
    /// stacks and classes every sample of the flush refers to.
    pub fn end_snapshot(
        &mut self,
        measuring: Measuring,
        measure: &mut impl FnMut(ObjectAddress) -> Option<u64>,
    ) -> (FlushSnapshot, Naming) {
        let (mut snapshot, naming) = self.end_snapshot_samples(measuring, measure);
        self.copy_stacks(&naming, &mut snapshot, usize::MAX);
        (snapshot, naming)
    }

    /// `copy_stacks` for at most `max` samples more, so that a caller can
    /// let other threads run in between (the stacks cannot change
    /// meanwhile: pruning is held for the flush). True when all are done.
    pub fn copy_stacks(&self, _naming: &Naming, snapshot: &mut FlushSnapshot, max: usize) -> bool {
        let end = snapshot
            .samples
            .len()
            .min(snapshot.stacks_copied.saturating_add(max));
        for index in snapshot.stacks_copied..end {
            let stack = snapshot.samples[index].stack;
            snapshot
                .stacks
                .entry(stack)
                .or_insert_with(|| self.stacks.frames(stack));
        }
        snapshot.stacks_copied = end;
        end == snapshot.samples.len()
    }

    /// Reads up to `max` more samples of the detached allocation list into
    /// the flush (once `measure_live` is done), so that a caller can let
    /// other threads run in between. True when all are read (or no flush
    /// is measuring).
    pub fn read_allocations(
        &mut self,
        _measuring: &Measuring,
        max: usize,
        measure: &mut impl FnMut(ObjectAddress) -> Option<u64>,
    ) -> bool {
        let mut flush = match std::mem::replace(&mut self.phase, FlushPhase::Idle) {
            FlushPhase::Measuring(flush) => flush,
            other => {
                debug_assert!(false, "read_allocations outside the measuring phase");
                self.phase = other;
                return true;
            }
        };
        debug_assert_eq!(flush.next_live, flush.live_end, "live samples first");
        flush.heap_samples.get_or_insert(flush.samples.len());
        let held = self.held.take().unwrap_or_default();
        let end = held.len().min(flush.next_allocation.saturating_add(max));
        for index in flush.next_allocation..end {
            // Still held after it is read, until the profile is delivered.
            let Some((id, scale)) = held.entry(index) else {
                break;
            };
            if id == TOMBSTONE {
                continue;
            }
            let record = &mut self.records[id.0 as usize];
            // Not measured yet (taken just now): measure while it is alive.
            if record.size == 0 && record.marks.liveness() == Liveness::Live {
                if let Some(size) = measure(record.object) {
                    record.size = size;
                }
            }
            let weight = f64::from(record.alloc_weight) * scale;
            let class = record.class;
            // Its record may be the class name's last holder.
            self.hold_class_for_flush(class);
            flush.classes.insert(class);
            let record = &self.records[id.0 as usize];
            flush.samples.push(FlushedSample {
                stack: self.stacks.forwarded(record.stack),
                class,
                gc_age: None,
                values: [weight, weight * record.size as f64, 0.0, 0.0],
                window: record.info().window(),
                window_probability: record.info().window_probability(),
                labels: record.info().labels,
            });
            flush.allocation_samples += 1;
            self.park(id);
        }
        flush.next_allocation = end;
        let done = end == held.len();
        self.held = Some(held);
        self.phase = FlushPhase::Measuring(flush);
        done
    }

    /// `end_snapshot` without the stacks' frames: `copy_stacks` copies
    /// them, in chunks if asked. Reads what `read_allocations` has not.
    pub fn end_snapshot_samples(
        &mut self,
        measuring: Measuring,
        measure: &mut impl FnMut(ObjectAddress) -> Option<u64>,
    ) -> (FlushSnapshot, Naming) {
        self.read_allocations(&measuring, usize::MAX, measure);
        self.end_walk();
        let flush = match std::mem::replace(&mut self.phase, FlushPhase::Naming) {
            FlushPhase::Measuring(flush) => flush,
            other => {
                debug_assert!(false, "end_snapshot outside the measuring phase");
                self.phase = other;
                return (FlushSnapshot::default(), Naming::new());
            }
        };
        let FlushInProgress {
            samples,
            heap_samples,
            allocation_samples,
            classes,
            too_young,
            ..
        } = flush;
        let drops = self.held.as_ref().map(|h| h.drops).unwrap_or_default();
        let mut snapshot = FlushSnapshot {
            heap_samples: heap_samples.unwrap_or(samples.len()),
            allocation_samples,
            // (At most one stack a sample, and at most what is stored:
            // sized once, not rehashed in `copy_stacks`.)
            stacks: FastHashMap::with_capacity_and_hasher(
                samples.len().min(self.stacks.len()),
                Default::default(),
            ),
            samples,
            drops,
            too_young,
            ..FlushSnapshot::default()
        };
        // All of them (per distinct frame, not per stack position; the
        // builder picks what it needs).
        snapshot.resolved_frames = self
            .stacks
            .resolved_infos()
            .map(|(frame, info)| (frame, info.clone()))
            .collect();
        let mut classes: Vec<ClassRef> = classes.into_iter().collect();
        classes.sort_unstable();
        for &class in classes.iter().filter(|&&c| is_named_class(c)) {
            if let Some(name) = self.named_classes.name(class) {
                snapshot.resolved_classes.insert(class, name.to_string());
            }
        }
        classes.retain(|&c| !is_named_class(c));
        self.flush_classes = classes;
        (snapshot, Naming::new())
    }

    /// Distinct classes of the flush in progress, to be named.
    pub fn flush_classes(&self) -> &[ClassRef] {
        &self.flush_classes
    }

    /// Last step, once the profile is built: the flush delivers it, so the
    /// interval's samples are released (`release_delivered`); stacks go
    /// with their last sample again, and those that fell unused during the
    /// flush go (`END_FLUSH_PRUNE` now, the rest with `prune_unused`, in
    /// chunks). Nothing after it may fail: a flush that does not return its
    /// profile must end with `end_flush` instead.
    pub fn finish_flush(&mut self, _detaching: Detaching) {
        self.deliver();
        self.end_flush();
    }

    /// For tests that read a snapshot without detaching: the flush, in any
    /// phase, delivered its profile, and its samples are released at once.
    #[cfg(test)]
    pub fn deliver_flush(&mut self) {
        if self.flush_in_progress() {
            self.deliver();
            self.end_flush();
        }
        self.release_delivered(usize::MAX);
    }

    /// After a flush: removes up to `max` more of the stacks that fell
    /// unused while it ran (or while an earlier one, cut short, ran). True
    /// when none is left.
    pub fn prune_unused(&mut self, max: usize) -> bool {
        self.stacks.drain_unused(max)
    }

    /// Ends a flush in whatever phase it is (see the top of this file): a
    /// flush that did not deliver its profile gives its interval's samples
    /// back to the next one (held_interval.rs), what the flush held is
    /// released, and stacks go with their last sample again (those that
    /// fell unused: see `finish_flush`). Nothing to do without a flush (the
    /// collector's guard calls it after `finish_flush` too).
    /// True when it gave samples back (false without a flush, after
    /// `finish_flush`, and after a `clear` during the flush).
    pub fn end_flush(&mut self) -> bool {
        if !self.flush_in_progress() {
            return false;
        }
        self.stacks.end_detach();
        // A detach cut short leaves merged stacks forwarded: the samples
        // still on a merged id move at the next detach, which goes over
        // every record, in chunks (moving them here took one hold over all
        // the records). Until then every use of a sample's stack goes
        // through `forwarded`.
        self.detach_class_names.clear();
        self.end_walk();
        self.phase = FlushPhase::Idle;
        let given_back = self.give_back();
        self.flush_classes.clear();
        for class in std::mem::take(&mut self.flush_named_holds) {
            self.named_classes.release(class);
        }
        self.stacks.release_pruning(END_FLUSH_PRUNE);
        given_back
    }

    /// The walk for live samples is over: samples taken meanwhile are
    /// like any other from now on.
    fn end_walk(&mut self) {
        for id in std::mem::take(&mut self.taken_in_walk) {
            if let Some(record) = self.records.get_mut(id.index()) {
                record.marks.set(Marks::TAKEN_IN_WALK, false);
            }
        }
    }

    /// Whether a flush is walking the records for live samples.
    pub(super) fn measuring_live(&self) -> bool {
        matches!(self.phase, FlushPhase::Measuring(_))
    }

    pub fn flush_in_progress(&self) -> bool {
        !matches!(self.phase, FlushPhase::Idle)
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

    /// `begin_flush`, `measure_live` over every live object and
    /// `end_snapshot` at once, for tests: the flush is left naming.
    #[cfg(any(test, feature = "test-helpers"))]
    pub fn take_snapshot(
        &mut self,
        gc_count: u32,
        measure: impl FnMut(ObjectAddress) -> Option<u64>,
    ) -> FlushSnapshot {
        self.take_snapshot_with(InuseCutoff::at_flush(gc_count), measure)
    }

    /// `take_snapshot` counting in use what `cutoff` counts.
    #[cfg(any(test, feature = "test-helpers"))]
    pub fn take_snapshot_with(
        &mut self,
        cutoff: InuseCutoff,
        mut measure: impl FnMut(ObjectAddress) -> Option<u64>,
    ) -> FlushSnapshot {
        let measuring = self.begin_flush();
        while !self.measure_live(&measuring, cutoff, usize::MAX, &mut measure) {}
        self.end_snapshot(measuring, &mut measure).0
    }
}
