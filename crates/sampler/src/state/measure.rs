//! Sizing samples: new ones once the allocating method has filled their
//! object in (a postponed job, or the FREEOBJ hook for one freed first),
//! and following tracked objects that GC compaction moved.

use rand::RngExt;

use super::{Liveness, Marks, SampleId, SamplerState, TOMBSTONE};
use crate::types::ObjectAddress;

/// The addresses whose object moved, each with its new address. The
/// caller removes all their entries before it re-inserts any, because a
/// new address may be another entry's old one.
fn moved_addresses<'a>(
    addresses: impl Iterator<Item = &'a ObjectAddress>,
    new_address: &mut impl FnMut(ObjectAddress) -> ObjectAddress,
) -> Vec<(ObjectAddress, ObjectAddress)> {
    addresses
        .filter_map(|&old| {
            let new = new_address(old);
            (new != old).then_some((old, new))
        })
        .collect()
}

impl SamplerState {
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
        let mut waiting = Vec::new();
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
            if record.marks.liveness() != Liveness::Live
                && record.marks.liveness() != Liveness::Watched
            {
                continue;
            }
            // Lazy liveness: a tracked sample without its object id yet (one
            // taken while the binding was asking for the others' ids) stays
            // pending, and pinned, for the next job. Measured now, it would
            // be let go with no id to check it by, and count as live forever.
            if self.lazy_liveness
                && record.marks.liveness() == Liveness::Live
                && self.object_id_of(id) == 0
            {
                waiting.push((id, object));
                continue;
            }
            match measure(object) {
                Some(size) => {
                    let retain = self.allocation_retain_rate;
                    let record = &mut self.records[id.0 as usize];
                    record.size = size;
                    if retain < 1.0 && !record.marks.alloc_dropped() {
                        if uniform() < retain {
                            record.alloc_weight /= retain as f32;
                        } else {
                            record.marks.set(Marks::ALLOC_DROPPED, true);
                            dropped_any = true;
                        }
                    }
                }
                None => {
                    self.record_free(object);
                }
            }
        }
        // Every pending sample has now been measured (or found gone), but
        // those waiting for an id, which are tracked, not watched.
        self.forget_watched();
        if dropped_any {
            self.release_dropped_allocations();
        }
        // Keep the buffer's capacity for the next batch.
        self.pending_sizes = pending;
        self.pending_sizes.clear();
        self.pending_sizes.extend(waiting);
    }

    /// Turns thinned-out samples' allocation-list entries into tombstones.
    fn release_dropped_allocations(&mut self) {
        let mut released = Vec::new();
        for entry in self.allocations.iter_mut() {
            if *entry != TOMBSTONE && self.records[entry.0 as usize].marks.alloc_dropped() {
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
        let moved: Vec<(SampleId, ObjectAddress)> =
            moved_addresses(self.live.keys(), &mut new_address)
                .into_iter()
                .filter_map(|(old, new)| Some((self.live.remove(&old)?, new)))
                .collect();
        for (id, new) in moved {
            self.records[id.0 as usize].object = new;
            if let Some(stale) = self.live.insert(new, id) {
                // A key left over at the new address (its free was missed):
                // that object is gone.
                self.records[stale.0 as usize]
                    .marks
                    .set_liveness(Liveness::Freed);
                self.release(stale);
            }
        }
        let moved: Vec<(SampleId, ObjectAddress)> =
            moved_addresses(self.watched.keys(), &mut new_address)
                .into_iter()
                .filter_map(|(old, new)| Some((self.watched.remove(&old)?, new)))
                .collect();
        for (id, new) in moved {
            self.records[id.0 as usize].object = new;
            if let Some(stale) = self.watched.insert(new, id) {
                self.records[stale.0 as usize]
                    .marks
                    .set_liveness(Liveness::Freed);
                self.release(stale);
            }
        }
        for (id, object) in &mut self.pending_sizes {
            if let Some(record) = self.records.get(id.0 as usize) {
                let watched = matches!(record.marks.liveness(), Liveness::Live | Liveness::Watched);
                if record.refs > 0 && watched {
                    *object = record.object;
                }
            }
        }
        self.rebuild_free_filter();
    }
}
