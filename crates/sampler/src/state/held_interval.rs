//! What a flush takes from its interval, and what becomes of it.
//!
//! `begin_flush` takes the interval's allocation samples and drop counts
//! (`HeldInterval`), and the flush reads them without letting go of them.
//! Only a flush that delivers its profile (`finish_flush`) is done with
//! them: their records are released after it, by `release_delivered`, in
//! chunks at the start of the next flush. A flush that ends otherwise (the
//! thread killed or raised into while it let others run, an error) gives
//! them back (`give_back`): the next profile counts them, so no interval's
//! allocations are lost to an interrupted flush.
//!
//! Read, a sample that nothing else holds (no live sample shares its record)
//! is parked: it lets go of its stack, as a released sample would, so the
//! flush's detach does not convert a stack about to go; the stack stays
//! stored (pruning is held) until the flush ends, when a sample given back
//! takes it again.
//!
//! A given-back sample keeps the weight its list's scale gave it. When the
//! next flush begins, if those and its own list are more than the cap, the
//! union is thinned to the cap by threshold sampling (sampler/threshold.rs),
//! which keeps every total and every subset unbiased: no profile, and no
//! flush, holds more than `max_allocation_samples`.

use rand::RngExt;

use super::{DropCounters, Marks, SampleId, SamplerState, TOMBSTONE};
use crate::reservoir::{usable_weight, ReservoirScales};
use crate::threshold::{keep_probability, kept_weight, threshold_for};

/// The allocation samples and drop counts a flush took from its interval.
#[derive(Debug, Default)]
pub(super) struct HeldInterval {
    /// The allocation list as the flush found it (a slot per index; a
    /// `TOMBSTONE` was thinned out), each entry scaled by `scales`.
    list: Vec<SampleId>,
    scales: ReservoirScales,
    /// Samples earlier flushes gave back, their weights final.
    returned: Vec<SampleId>,
    pub(super) drops: DropCounters,
    /// `clear` ran during the flush: nothing is given back.
    discard: bool,
}

impl HeldInterval {
    /// Entries to read: the list's, then those given back.
    pub(super) fn len(&self) -> usize {
        self.list.len() + self.returned.len()
    }

    /// Entry `index` (of `len`) and what its weight is multiplied by.
    pub(super) fn entry(&self, index: usize) -> Option<(SampleId, f64)> {
        match self.list.get(index) {
            Some(&id) => Some((id, self.scales.scale(index))),
            None => Some((*self.returned.get(index - self.list.len())?, 1.0)),
        }
    }

    /// Every sample it holds (no tombstones).
    fn ids(&self) -> impl Iterator<Item = SampleId> + '_ {
        self.list
            .iter()
            .chain(&self.returned)
            .copied()
            .filter(|&id| id != TOMBSTONE)
    }
}

impl DropCounters {
    fn add(&mut self, other: DropCounters) {
        self.nolock += other.nolock;
        self.allocation_bufsize += other.allocation_bufsize;
        self.heap_bufsize += other.heap_bufsize;
    }
}

impl SamplerState {
    /// At `begin_flush`: the interval's allocation samples, drops and what
    /// earlier flushes gave back, for the flush to hold.
    pub(super) fn take_interval(&mut self) -> HeldInterval {
        let list = std::mem::take(&mut self.allocations);
        let scales = self.reservoir.take();
        let returned = std::mem::take(&mut self.returned);
        let kept = list.iter().filter(|&&id| id != TOMBSTONE).count() + returned.len();
        if returned.is_empty() || kept <= self.max_allocation_samples {
            return HeldInterval {
                list,
                scales,
                returned,
                drops: std::mem::take(&mut self.drops),
                discard: false,
            };
        }
        // With what an earlier flush gave back, more than the cap: the
        // union, each at its weight, thinned to the cap (a profile never
        // holds more allocation samples than `max_allocation_samples`).
        let mut union = returned;
        for (slot, &id) in list.iter().enumerate() {
            if id != TOMBSTONE {
                self.scale_weight(id, scales.scale(slot));
                union.push(id);
            }
        }
        let union = self.thin_to_cap(union);
        HeldInterval {
            list: Vec::new(),
            scales: ReservoirScales::default(),
            returned: union,
            drops: std::mem::take(&mut self.drops),
            discard: false,
        }
    }

    /// A sample's allocation weight times `scale` (its list slot's).
    fn scale_weight(&mut self, id: SampleId, scale: f64) {
        if scale != 1.0 {
            let record = &mut self.records[id.index()];
            record.alloc_weight = usable_weight(f64::from(record.alloc_weight) * scale) as f32;
        }
    }

    /// The flush delivered its profile: its samples are released by
    /// `release_delivered`.
    pub(super) fn deliver(&mut self) {
        if let Some(held) = self.held.take() {
            if self.delivered.is_empty() {
                // (The common case: no copy.)
                let HeldInterval { list, returned, .. } = held;
                self.delivered = list;
                self.delivered.retain(|&id| id != TOMBSTONE);
                self.delivered.extend(returned);
            } else {
                self.delivered.extend(held.ids());
            }
        }
    }

    /// The flush ended without delivering: its samples and drops go to the
    /// next flush (released instead after `clear`). True if it gave any
    /// back.
    pub(super) fn give_back(&mut self) -> bool {
        let Some(held) = self.held.take() else {
            return false;
        };
        if held.discard {
            for id in held.ids().collect::<Vec<_>>() {
                self.release(id);
            }
            return false;
        }
        for id in held.ids() {
            self.unpark(id);
        }
        let mut returned = std::mem::take(&mut self.returned);
        returned.reserve(held.len());
        for (slot, &id) in held.list.iter().enumerate() {
            if id != TOMBSTONE {
                self.scale_weight(id, held.scales.scale(slot));
                returned.push(id);
            }
        }
        returned.extend(held.returned.iter().copied().filter(|&id| id != TOMBSTONE));
        self.drops.add(held.drops);
        // (No more than the cap: the flush held no more.)
        self.returned = returned;
        true
    }

    /// A sample just read (see the top).
    pub(super) fn park(&mut self, id: SampleId) {
        let record = &mut self.records[id.index()];
        if record.refs == 1 && !record.marks.parked() {
            record.marks.set(Marks::PARKED, true);
            let stack = record.stack;
            self.stacks.release(stack);
        }
    }

    /// A parked sample given back takes its stack again (where a detach
    /// merged it: `retain` follows the forwarding). Before the flush lets
    /// pruning go.
    fn unpark(&mut self, id: SampleId) {
        let record = &mut self.records[id.index()];
        if record.marks.parked() {
            record.marks.set(Marks::PARKED, false);
            let stack = record.stack;
            self.stacks.retain(stack);
        }
    }

    /// Thins `ids` (weights final) to `max_allocation_samples`: threshold
    /// sampling keeps the heavy ones whole and each light one with
    /// probability weight / threshold, standing for the threshold if kept.
    /// The light ones are drawn systematically (one draw, then every unit of
    /// summed probability), so that exactly the cap is kept, each with its
    /// own probability: a hard bound and unbiased totals.
    fn thin_to_cap(&mut self, ids: Vec<SampleId>) -> Vec<SampleId> {
        let cap = self.max_allocation_samples;
        if ids.len() <= cap {
            return ids;
        }
        let mut weights: Vec<f32> = ids
            .iter()
            .map(|id| self.records[id.index()].alloc_weight)
            .collect();
        let threshold = if cap == 0 {
            f64::INFINITY
        } else {
            threshold_for(&mut weights, cap as f64)
        };
        let start = self.retain_rng.random::<f64>();
        let mut summed = 0.0;
        let mut let_go = Vec::new();
        let mut kept = Vec::with_capacity(cap);
        for id in ids {
            let record = &mut self.records[id.index()];
            let weight = f64::from(record.alloc_weight);
            let before = summed;
            summed += keep_probability(weight, threshold);
            // Kept if a point start + k (k = 0, 1, ..) falls in (before, summed].
            if (summed - start).floor() > (before - start).floor() && kept.len() < cap {
                record.alloc_weight = usable_weight(kept_weight(weight, threshold)) as f32;
                kept.push(id);
            } else {
                let_go.push(id);
            }
        }
        self.drops.allocation_bufsize += let_go.len() as u64;
        for id in let_go {
            self.release(id);
        }
        kept
    }

    /// What the flush in progress holds is let go when it ends, not given
    /// back: after `clear`, and in a forked child for a flush of the
    /// parent's.
    pub fn discard_held(&mut self) {
        if let Some(held) = &mut self.held {
            held.discard = true;
        }
    }

    /// Releases up to `max` more of the samples of delivered flushes. True
    /// when none is left.
    pub fn release_delivered(&mut self, max: usize) -> bool {
        let keep = self.delivered.len().saturating_sub(max);
        let released: Vec<SampleId> = self.delivered.drain(keep..).collect();
        for id in released {
            self.release(id);
        }
        self.delivered.is_empty()
    }

    /// Whether delivered flushes left samples or unused stacks to release.
    pub fn has_flush_leftovers(&self) -> bool {
        !self.delivered.is_empty() || self.stacks.unused_len() > 0
    }

    /// Releases what was given back or delivered (`clear`, a forked child).
    pub(super) fn release_returned_and_delivered(&mut self) {
        for id in std::mem::take(&mut self.returned) {
            self.release(id);
        }
        for id in std::mem::take(&mut self.delivered) {
            self.release(id);
        }
    }
}
