//! Deduplicated backtraces. Many samples share a stack, so each distinct
//! stack is stored once and samples refer to it by `StackId`. Stacks are
//! refcounted by the samples that use them; stacks nobody uses are removed
//! by `prune` (called at flush, never from an allocation hook), which also
//! tells which frames no longer need to be kept alive.

use std::sync::Arc;

use super::fast_hash::FastHashMap;

/// An opaque handle to a frame (in the binding layer: the VALUE that
/// `rb_profile_frames` returned). The core never looks inside it.
pub type FrameRef = u64;

/// Stands for the frames cut off when a stack is deeper than the capture
/// limit. 0 is never a frame handle (it is Ruby's `false`).
pub const TRUNCATION_FRAME: FrameRef = 0;

/// One entry of a backtrace: which frame, at which line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Frame {
    pub frame: FrameRef,
    pub line: i32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StackId(u32);

impl StackId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

#[derive(Debug)]
struct StackEntry {
    frames: Arc<[Frame]>,
    refs: u32,
}

#[derive(Debug, Default)]
pub struct StackTable {
    entries: Vec<Option<StackEntry>>,
    free_ids: Vec<u32>,
    index: FastHashMap<Arc<[Frame]>, StackId>,
    /// How many stored stacks contain each frame: the frames to keep alive.
    frame_refs: FastHashMap<FrameRef, u32>,
    frame_slots: usize,
}

impl StackTable {
    pub fn new() -> Self {
        Self::default()
    }

    /// The id of the stack made of `frames` (leaf first), adding it if it is
    /// new, with one more reference taken on it.
    pub fn intern(&mut self, frames: &[Frame]) -> StackId {
        if let Some(&id) = self.index.get(frames) {
            self.retain(id);
            return id;
        }
        let frames: Arc<[Frame]> = Arc::from(frames);
        for frame in frames.iter() {
            *self.frame_refs.entry(frame.frame).or_insert(0) += 1;
        }
        self.frame_slots += frames.len();
        let entry = StackEntry {
            frames: Arc::clone(&frames),
            refs: 1,
        };
        let id = match self.free_ids.pop() {
            Some(slot) => {
                self.entries[slot as usize] = Some(entry);
                StackId(slot)
            }
            None => {
                let slot = u32::try_from(self.entries.len()).expect("fewer than 2^32 stacks");
                self.entries.push(Some(entry));
                StackId(slot)
            }
        };
        self.index.insert(frames, id);
        id
    }

    pub fn retain(&mut self, id: StackId) {
        self.entry_mut(id).refs += 1;
    }

    /// Drops one reference. The stack stays stored until `prune`, so that a
    /// flush in progress can still resolve its frames.
    pub fn release(&mut self, id: StackId) {
        let entry = self.entry_mut(id);
        debug_assert!(entry.refs > 0, "stack released more often than retained");
        entry.refs = entry.refs.saturating_sub(1);
    }

    pub fn frames(&self, id: StackId) -> &Arc<[Frame]> {
        &self.entry(id).frames
    }

    #[cfg(test)]
    pub fn refs(&self, id: StackId) -> u32 {
        self.entry(id).refs
    }

    /// Removes every stack no sample refers to. Returns how many were removed.
    pub fn prune(&mut self) -> usize {
        let mut removed = 0;
        for slot in 0..self.entries.len() {
            let unused = matches!(&self.entries[slot], Some(entry) if entry.refs == 0);
            if !unused {
                continue;
            }
            let entry = self.entries[slot].take().expect("checked above");
            self.index.remove(&entry.frames);
            for frame in entry.frames.iter() {
                if let Some(count) = self.frame_refs.get_mut(&frame.frame) {
                    *count -= 1;
                    if *count == 0 {
                        self.frame_refs.remove(&frame.frame);
                    }
                }
            }
            self.frame_slots -= entry.frames.len();
            self.free_ids.push(slot as u32);
            removed += 1;
        }
        removed
    }

    /// Every frame some stored stack contains: what the GC must keep alive.
    pub fn live_frames(&self) -> impl Iterator<Item = FrameRef> + '_ {
        self.frame_refs
            .keys()
            .copied()
            .filter(|&f| f != TRUNCATION_FRAME)
    }

    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Approximate heap bytes used, for `ObjectSpace.memsize_of`.
    pub fn memory_bytes(&self) -> usize {
        use std::mem::size_of;
        self.entries.capacity() * size_of::<Option<StackEntry>>()
            + self.free_ids.capacity() * size_of::<u32>()
            + self.index.capacity() * (size_of::<Arc<[Frame]>>() + size_of::<StackId>() + 8)
            + self.frame_refs.capacity() * (size_of::<FrameRef>() + size_of::<u32>() + 8)
            + self.frame_slots * size_of::<Frame>()
    }

    fn entry(&self, id: StackId) -> &StackEntry {
        self.entries[id.index()]
            .as_ref()
            .expect("stack id refers to a stored stack")
    }

    fn entry_mut(&mut self, id: StackId) -> &mut StackEntry {
        self.entries[id.index()]
            .as_mut()
            .expect("stack id refers to a stored stack")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stack(frames: &[(u64, i32)]) -> Vec<Frame> {
        frames
            .iter()
            .map(|&(frame, line)| Frame { frame, line })
            .collect()
    }

    #[test]
    fn identical_stacks_share_one_entry() {
        let mut table = StackTable::new();
        let a = table.intern(&stack(&[(8, 1), (16, 2)]));
        let b = table.intern(&stack(&[(8, 1), (16, 2)]));
        let c = table.intern(&stack(&[(8, 3), (16, 2)]));
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(table.len(), 2);
        assert_eq!(table.refs(a), 2);
        assert_eq!(&table.frames(c)[..], &stack(&[(8, 3), (16, 2)])[..]);
    }

    #[test]
    fn prune_removes_only_unreferenced_stacks_and_their_frames() {
        let mut table = StackTable::new();
        let kept = table.intern(&stack(&[(8, 1), (16, 2)]));
        let dropped = table.intern(&stack(&[(24, 1), (16, 2)]));
        table.release(dropped);
        // Released but not pruned: still resolvable.
        assert_eq!(table.frames(dropped).len(), 2);
        assert_eq!(table.prune(), 1);
        assert_eq!(table.len(), 1);
        let mut frames: Vec<_> = table.live_frames().collect();
        frames.sort();
        assert_eq!(frames, vec![8, 16]);
        assert_eq!(table.refs(kept), 1);
    }

    #[test]
    fn freed_ids_are_reused_and_reinterning_works() {
        let mut table = StackTable::new();
        let first = table.intern(&stack(&[(8, 1)]));
        table.release(first);
        table.prune();
        assert!(table.is_empty());
        let second = table.intern(&stack(&[(40, 7)]));
        assert_eq!(second.index(), first.index());
        let again = table.intern(&stack(&[(8, 1)]));
        assert_ne!(again, second);
        assert_eq!(table.live_frames().count(), 2);
    }

    #[test]
    fn truncation_marker_is_not_a_live_frame() {
        let mut table = StackTable::new();
        table.intern(&stack(&[(8, 1), (TRUNCATION_FRAME, 0)]));
        assert_eq!(table.live_frames().collect::<Vec<_>>(), vec![8]);
    }

    #[test]
    fn memory_accounting_grows_with_content() {
        let mut table = StackTable::new();
        let empty = table.memory_bytes();
        for i in 0..100u64 {
            table.intern(&stack(&[(8 * (i + 1), 1), (16, 2)]));
        }
        assert!(table.memory_bytes() > empty);
    }
}
