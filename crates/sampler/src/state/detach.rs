//! After a flush has named its frames and classes: the samples hold them
//! by name from then on, instead of keeping Ruby objects alive (see
//! `StackTable::detach_frames` and `named_classes` for why).

use super::flush::{Detaching, FlushPhase, Naming};
use super::SamplerState;
use crate::fast_hash::FastHashMap;
use crate::stack_table::FrameInfo;

/// Records whose stacks are moved per stack of a detach batch: a batch
/// costs about as much in either half.
const RECORDS_PER_STACK: usize = 64;
use crate::types::{is_ruby_class, ClassRef, FrameRef};

impl SamplerState {
    /// Third step of a flush (see flush.rs): the stacks are queued to hold
    /// their frames by name, and the samples to hold the classes just named
    /// (`class_names`) by name (both in `detach_frames_batch`).
    pub fn begin_detach(
        &mut self,
        _naming: Naming,
        class_names: &FastHashMap<ClassRef, String>,
    ) -> Detaching {
        debug_assert!(matches!(self.phase, FlushPhase::Naming));
        self.detach_class_names = class_names.clone();
        self.stacks.begin_detach();
        self.remap_from = None;
        self.phase = FlushPhase::Detaching;
        Detaching::new()
    }

    /// One batch of the detach: at most `max_stacks` stacks hold the frames
    /// named in `names` by name (a stack can merge with one already held by
    /// name). Once all are, the samples take the named classes and follow
    /// merged stacks to where they went, `max_stacks` x `RECORDS_PER_STACK`
    /// records a batch (the table forwards the merged ids meanwhile).
    /// Returns whether all is done.
    pub fn detach_frames_batch(
        &mut self,
        _detaching: &Detaching,
        names: &FastHashMap<FrameRef, FrameInfo>,
        max_stacks: usize,
    ) -> bool {
        if self.remap_from.is_none() {
            if !self.stacks.detach_batch(names, max_stacks) {
                return false;
            }
            self.remap_from = Some(0);
        }
        self.detach_records(max_stacks.saturating_mul(RECORDS_PER_STACK))
    }

    /// Up to `max` more records: named classes held by name, samples moved
    /// off merged stacks. True when every record is done (the merged ids
    /// are then free again). Records taken meanwhile hold no merged id;
    /// those past the chunks already done take named classes in this
    /// flush, the others at a later one.
    fn detach_records(&mut self, max: usize) -> bool {
        let from = self.remap_from.unwrap_or(0);
        let end = self.records.len().min(from.saturating_add(max));
        let names = std::mem::take(&mut self.detach_class_names);
        self.detach_classes_in(from..end, &names);
        self.detach_class_names = names;
        self.remap_stacks_in(from..end);
        self.remap_from = Some(end);
        if end < self.records.len() {
            return false;
        }
        self.stacks.end_forwarding();
        self.detach_class_names.clear();
        true
    }

    fn remap_stacks_in(&mut self, range: std::ops::Range<usize>) {
        if !self.stacks.is_forwarding() {
            return;
        }
        for record in &mut self.records[range] {
            if record.refs > 0 {
                record.stack = self.stacks.forwarded(record.stack);
            }
        }
    }

    /// After a flush has named its classes (`names`): samples hold those
    /// classes by name from now on (see `named_classes`).
    fn detach_classes_in(
        &mut self,
        range: std::ops::Range<usize>,
        names: &FastHashMap<ClassRef, String>,
    ) {
        if names.is_empty() {
            return;
        }
        // Each name is hashed once; every further record is a hold.
        let mut named: FastHashMap<ClassRef, ClassRef> = FastHashMap::default();
        for record in self.records[range].iter_mut().filter(|r| r.refs > 0) {
            let class = record.class;
            if !is_ruby_class(class) {
                continue;
            }
            let Some(name) = names.get(&class) else {
                continue;
            };
            record.class = match named.get(&class) {
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

    /// `begin_detach` and every batch at once, for tests (no token needed).
    #[cfg(test)]
    pub fn detach_resolved_frames(&mut self, names: &FastHashMap<FrameRef, FrameInfo>) {
        self.stacks.begin_detach();
        self.remap_from = None;
        self.phase = FlushPhase::Detaching;
        while !self.detach_frames_batch(&Detaching::new(), names, usize::MAX) {}
    }

    /// `begin_detach`'s class half, for tests.
    #[cfg(test)]
    pub fn detach_resolved_classes(&mut self, names: &FastHashMap<ClassRef, String>) {
        self.detach_classes_in(0..self.records.len(), names);
    }
}
