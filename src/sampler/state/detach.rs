//! After a flush has named its frames and classes: the samples hold them
//! by name from then on, instead of keeping Ruby objects alive (see
//! `StackTable::detach_frames` and `named_classes` for why).

use super::flush::{Detaching, FlushPhase, Naming};
use super::SamplerState;
use crate::fast_hash::FastHashMap;
use crate::sampler::stack_table::{FrameInfo, StackId};
use crate::sampler::types::{is_ruby_class, ClassRef, FrameRef};

impl SamplerState {
    /// Third step of a flush (see flush.rs): the classes just named
    /// (`class_names`) are held by name from now on, and the stacks are
    /// queued to hold their frames by name (`detach_frames_batch`).
    pub fn begin_detach(
        &mut self,
        _naming: Naming,
        class_names: &FastHashMap<ClassRef, String>,
    ) -> Detaching {
        debug_assert!(matches!(self.phase, FlushPhase::Naming));
        self.detach_classes(class_names);
        self.stacks.begin_detach();
        self.phase = FlushPhase::Detaching;
        Detaching::new()
    }

    /// One batch of the detach: at most `max_stacks` stacks hold the frames
    /// named in `names` by name, their samples moved in the same step (a
    /// stack can merge with one already held by name). Returns whether all
    /// are done.
    pub fn detach_frames_batch(
        &mut self,
        _detaching: &Detaching,
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
    fn detach_classes(&mut self, names: &FastHashMap<ClassRef, String>) {
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

    /// `begin_detach` and every batch at once, for tests (no token needed).
    #[cfg(test)]
    pub fn detach_resolved_frames(&mut self, names: &FastHashMap<FrameRef, FrameInfo>) {
        self.stacks.begin_detach();
        self.phase = FlushPhase::Detaching;
        while !self.detach_frames_batch(&Detaching::new(), names, usize::MAX) {}
    }

    /// `begin_detach`'s class half, for tests.
    #[cfg(test)]
    pub fn detach_resolved_classes(&mut self, names: &FastHashMap<ClassRef, String>) {
        self.detach_classes(names);
    }
}
