//! Deduplicated backtraces. Many samples share a stack, so each distinct
//! stack is stored once and samples refer to it by `StackId`. Stacks are
//! refcounted by the samples that use them; stacks nobody uses are removed
//! by `prune` (called at flush, never from an allocation hook), which also
//! tells which frames no longer need to be kept alive.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use super::fast_hash::{FastHashMap, FastHasher};

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

/// A stored stack: ids into the frame table, leaf first.
#[derive(Debug)]
struct StackEntry {
    frames: Box<[u32]>,
    hash: u64,
    refs: u32,
    /// The next stack whose frames hash the same (rare), or NO_STACK.
    next_same_hash: u32,
}

const NO_STACK: u32 = u32::MAX;

/// One distinct (frame, line), and how many stored stack positions use it.
#[derive(Debug)]
struct FrameSlot {
    frame: Frame,
    uses: u32,
}

/// Stacks are stored as 4-byte ids of distinct (frame, line) pairs rather
/// than 16-byte frames: an application has a few thousand of those but its
/// stacks repeat them in hundreds of thousands of positions, so this is
/// most of the difference between ~60 and ~15 bytes of stacks per sample.
#[derive(Debug, Default)]
pub struct StackTable {
    entries: Vec<Option<StackEntry>>,
    free_ids: Vec<u32>,
    /// Hash of a stack's frames -> the first stored stack with that hash.
    by_hash: FastHashMap<u64, u32>,
    frame_slots: Vec<FrameSlot>,
    free_frame_slots: Vec<u32>,
    frame_ids: FastHashMap<Frame, u32>,
    /// How many stored stack positions hold each frame handle: the frames
    /// to keep alive.
    frame_refs: FastHashMap<FrameRef, u32>,
    /// Stack positions stored (sum of stack lengths).
    positions: usize,
    stacks: usize,
}

fn hash_frames(frames: &[Frame]) -> u64 {
    let mut hasher = FastHasher::default();
    frames.hash(&mut hasher);
    hasher.finish()
}

impl StackTable {
    pub fn new() -> Self {
        Self::default()
    }

    /// The id of the stack made of `frames` (leaf first), adding it if it is
    /// new, with one more reference taken on it.
    pub fn intern(&mut self, frames: &[Frame]) -> StackId {
        let hash = hash_frames(frames);
        let mut candidate = self.by_hash.get(&hash).copied().unwrap_or(NO_STACK);
        while candidate != NO_STACK {
            let entry = self.entries[candidate as usize]
                .as_ref()
                .expect("hash chains hold stored stacks");
            if entry.frames.len() == frames.len()
                && entry
                    .frames
                    .iter()
                    .zip(frames)
                    .all(|(&id, frame)| self.frame_slots[id as usize].frame == *frame)
            {
                let id = StackId(candidate);
                self.retain(id);
                return id;
            }
            candidate = entry.next_same_hash;
        }
        let ids: Box<[u32]> = frames.iter().map(|&frame| self.frame_id(frame)).collect();
        self.positions += ids.len();
        self.stacks += 1;
        let next_same_hash = self.by_hash.get(&hash).copied().unwrap_or(NO_STACK);
        let entry = StackEntry {
            frames: ids,
            hash,
            refs: 1,
            next_same_hash,
        };
        let slot = match self.free_ids.pop() {
            Some(slot) => {
                self.entries[slot as usize] = Some(entry);
                slot
            }
            None => {
                let slot = u32::try_from(self.entries.len()).expect("fewer than 2^32 stacks");
                self.entries.push(Some(entry));
                slot
            }
        };
        self.by_hash.insert(hash, slot);
        StackId(slot)
    }

    /// The id of a (frame, line), one more use taken on it.
    fn frame_id(&mut self, frame: Frame) -> u32 {
        if let Some(&id) = self.frame_ids.get(&frame) {
            self.frame_slots[id as usize].uses += 1;
            return id;
        }
        *self.frame_refs.entry(frame.frame).or_insert(0) += 1;
        let slot = FrameSlot { frame, uses: 1 };
        let id = match self.free_frame_slots.pop() {
            Some(id) => {
                self.frame_slots[id as usize] = slot;
                id
            }
            None => {
                let id = u32::try_from(self.frame_slots.len()).expect("fewer than 2^32 frames");
                self.frame_slots.push(slot);
                id
            }
        };
        self.frame_ids.insert(frame, id);
        id
    }

    fn release_frame(&mut self, id: u32) {
        let slot = &mut self.frame_slots[id as usize];
        slot.uses -= 1;
        if slot.uses > 0 {
            return;
        }
        let frame = slot.frame;
        self.frame_ids.remove(&frame);
        self.free_frame_slots.push(id);
        if let Some(count) = self.frame_refs.get_mut(&frame.frame) {
            *count -= 1;
            if *count == 0 {
                self.frame_refs.remove(&frame.frame);
            }
        }
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

    /// The stack's frames, leaf first.
    pub fn frames(&self, id: StackId) -> Arc<[Frame]> {
        self.entry(id)
            .frames
            .iter()
            .map(|&frame| self.frame_slots[frame as usize].frame)
            .collect()
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
            self.unlink(slot as u32, &entry);
            for &frame in entry.frames.iter() {
                self.release_frame(frame);
            }
            self.positions -= entry.frames.len();
            self.stacks -= 1;
            self.free_ids.push(slot as u32);
            removed += 1;
        }
        removed
    }

    /// Takes a removed stack out of its hash chain.
    fn unlink(&mut self, slot: u32, entry: &StackEntry) {
        let head = self.by_hash.get(&entry.hash).copied().unwrap_or(NO_STACK);
        if head == slot {
            if entry.next_same_hash == NO_STACK {
                self.by_hash.remove(&entry.hash);
            } else {
                self.by_hash.insert(entry.hash, entry.next_same_hash);
            }
            return;
        }
        let mut previous = head;
        while previous != NO_STACK {
            let next = self.entries[previous as usize]
                .as_ref()
                .map_or(NO_STACK, |e| e.next_same_hash);
            if next == slot {
                if let Some(previous_entry) = self.entries[previous as usize].as_mut() {
                    previous_entry.next_same_hash = entry.next_same_hash;
                }
                return;
            }
            previous = next;
        }
    }

    /// Every frame some stored stack contains: what the GC must keep alive.
    pub fn live_frames(&self) -> impl Iterator<Item = FrameRef> + '_ {
        self.frame_refs
            .keys()
            .copied()
            .filter(|&f| f != TRUNCATION_FRAME)
    }

    pub fn len(&self) -> usize {
        self.stacks
    }

    /// Distinct frames the stored stacks hold (each keeps a Ruby object alive).
    pub fn frame_count(&self) -> usize {
        self.live_frames().count()
    }

    pub fn is_empty(&self) -> bool {
        self.stacks == 0
    }

    /// Approximate heap bytes used, for `ObjectSpace.memsize_of`.
    pub fn memory_bytes(&self) -> usize {
        use std::mem::size_of;
        self.entries.capacity() * size_of::<Option<StackEntry>>()
            + self.positions * size_of::<u32>()
            + self.free_ids.capacity() * size_of::<u32>()
            + self.by_hash.capacity() * (size_of::<u64>() + size_of::<u32>() + 4)
            + self.frame_slots.capacity() * size_of::<FrameSlot>()
            + self.free_frame_slots.capacity() * size_of::<u32>()
            + self.frame_ids.capacity() * (size_of::<Frame>() + size_of::<u32>() + 4)
            + self.frame_refs.capacity() * (size_of::<FrameRef>() + size_of::<u32>() + 4)
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
        // Frames are stored once: (16, 2) is shared by both stacks.
        assert_eq!(table.frame_slots.len(), 3);
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
    fn stacks_whose_hashes_collide_stay_apart_and_unlink_cleanly() {
        let mut table = StackTable::new();
        let a = table.intern(&stack(&[(8, 1)]));
        let b = table.intern(&stack(&[(16, 1)]));
        // Force a shared chain: b's entry claims a's hash.
        let hash_a = table.entry(a).hash;
        table.entry_mut(b).hash = hash_a;
        table.entry_mut(b).next_same_hash = a.0;
        table.by_hash.insert(hash_a, b.0);
        assert_eq!(table.intern(&stack(&[(8, 1)])), a);
        table.release(a);
        table.release(a);
        table.prune();
        assert_eq!(table.by_hash.get(&hash_a), Some(&b.0));
        assert_eq!(table.entry(b).next_same_hash, NO_STACK);
        let c = table.intern(&stack(&[(8, 1)]));
        assert_ne!(c, b);
        assert_eq!(&table.frames(b)[..], &stack(&[(16, 1)])[..]);
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
