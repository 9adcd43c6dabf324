//! Deduplicated backtraces. Many samples share a stack, so each distinct
//! stack is stored once and samples refer to it by `StackId`. Stacks are
//! refcounted by the samples that use them. A stack is removed when its
//! last sample goes, and its frames no longer kept alive, so that the table
//! holds only what the caps let samples hold, whatever the program's stacks
//! (a program of many distinct deep stacks otherwise filled it with those
//! of dropped and dead samples between flushes, and the flush removed them
//! all while holding the GVL). While a flush runs (`hold_pruning`), stack
//! ids and frames must stay as its snapshot saw them: stacks that fall
//! unused wait in a queue, which the flush empties in chunks once it ends
//! (`drain_unused`; a flush cut short leaves the rest to the next).
//!
//! A frame starts as a Ruby object (a method entry or iseq, kept alive by
//! the collector's mark function). Once a flush has named it, `detach_frames`
//! replaces it by its name ("resolved frame"), so the collector stops keeping
//! the Ruby object alive. Otherwise a sampled object that its own method's
//! code refers to (an inline cache made on the method's first call, a
//! constant) would keep that method, its class and everything they reference
//! alive for as long as the sample lives, i.e. for ever: code generated at
//! run time (anonymous classes, eval, templates) would leak.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use super::block_frames::MethodBlocks;
use super::id_slab::{IdSlab, SlabSpan};
use super::types::{
    is_resolved_frame, resolved_frame, resolved_frame_index, FrameRef, TRUNCATION_FRAME,
};
use crate::fast_hash::{FastHashMap, FastHasher};

/// What the binding layer found out about a frame at flush time.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FrameInfo {
    /// Ruby's label: `Foo#bar`, `block in Foo#bar`, `Integer#times`, `<main>`.
    pub name: String,
    /// Source file; None for methods implemented in C (and Ruby's own
    /// `<internal:...>` methods), which are shown at their caller's file and
    /// line, as Ruby's own backtraces do.
    pub filename: Option<String>,
    pub start_line: i64,
    /// For a method with blocks: which of its lines are the blocks' (a
    /// frame running one of its blocks is reported as the method itself).
    pub blocks: Option<Arc<MethodBlocks>>,
}

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

    /// An entry of `detach_frames`' result as a stack id (None: not moved).
    pub fn from_stored(id: u32) -> Option<StackId> {
        (id != NO_STACK).then_some(StackId(id))
    }
}

/// A stored stack: ids into the frame table, leaf first (in `ids`).
#[derive(Debug)]
struct StackEntry {
    frames: SlabSpan,
    hash: u64,
    refs: u32,
    /// The next stack whose frames hash the same (rare), or NO_STACK.
    next_same_hash: u32,
}

const NO_STACK: u32 = u32::MAX;

const NO_SLOT: u32 = u32::MAX;

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
    /// Each stored stack's frame slot ids.
    ids: IdSlab,
    /// Reused for the ids of a stack being interned.
    interning: Vec<u32>,
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
    /// Names of resolved frames, indexed by handle >> 1.
    resolved: Vec<Option<FrameInfo>>,
    free_resolved: Vec<u32>,
    resolved_by_info: FastHashMap<FrameInfo, FrameRef>,
    /// Stacks stored with Ruby frames in them since the last
    /// `detach_frames` (may also hold ids since pruned or reused), each id
    /// once (`ruby_listed`, by id): ids are reused as stacks come and go.
    with_ruby_frames: Vec<u32>,
    ruby_listed: Vec<bool>,
    /// While held (a flush in progress), stacks whose last reference goes
    /// wait in `unused` instead of being removed.
    prune_held: bool,
    unused: Vec<u32>,
    /// Stacks a detach in progress has still to look at (it works in
    /// batches, see `detach_frames`).
    detach_queue: Vec<u32>,
    /// Ids merged away during a detach in progress, and where each went:
    /// reused only once every sample holding one has been moved
    /// (`end_forwarding`; the samples are moved in chunks, and meanwhile a
    /// release of a merged id goes to where it went).
    merged_ids: Vec<u32>,
    forward: FastHashMap<u32, u32>,
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
                && self
                    .ids
                    .get(entry.frames)
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
        let mut ids = std::mem::take(&mut self.interning);
        ids.clear();
        ids.extend(frames.iter().map(|&frame| self.frame_id(frame)));
        let span = self.ids.insert(&ids);
        self.interning = ids;
        self.positions += span.len();
        self.stacks += 1;
        let holds_ruby_frames = frames
            .iter()
            .any(|f| f.frame != TRUNCATION_FRAME && !is_resolved_frame(f.frame));
        let next_same_hash = self.by_hash.get(&hash).copied().unwrap_or(NO_STACK);
        let entry = StackEntry {
            frames: span,
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
        if holds_ruby_frames {
            self.list_ruby(slot);
        }
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
                if is_resolved_frame(frame.frame) {
                    self.forget_resolved(frame.frame);
                }
            }
        }
    }

    /// The handle of the resolved frame named `info` (the same for the same
    /// name, file and line, so stacks of one code path resolved at different
    /// flushes are stored once).
    fn resolved_frame(&mut self, info: &FrameInfo) -> FrameRef {
        if let Some(&frame) = self.resolved_by_info.get(info) {
            return frame;
        }
        let index = match self.free_resolved.pop() {
            Some(index) => {
                self.resolved[index as usize] = Some(info.clone());
                index
            }
            None => {
                let index = u32::try_from(self.resolved.len()).expect("fewer than 2^32 frames");
                self.resolved.push(Some(info.clone()));
                index
            }
        };
        let frame = resolved_frame(index);
        self.resolved_by_info.insert(info.clone(), frame);
        frame
    }

    fn forget_resolved(&mut self, frame: FrameRef) {
        let index = resolved_frame_index(frame);
        if let Some(info) = self.resolved.get_mut(index).and_then(Option::take) {
            self.resolved_by_info.remove(&info);
            self.free_resolved.push(index as u32);
        }
    }

    /// Every resolved frame with its name (a few thousand at most: one per
    /// distinct method and line any stored stack still holds).
    pub fn resolved_infos(&self) -> impl Iterator<Item = (FrameRef, &FrameInfo)> + '_ {
        self.resolved
            .iter()
            .enumerate()
            .filter_map(|(index, info)| Some((resolved_frame(index as u32), info.as_ref()?)))
    }

    /// The name of a resolved frame.
    pub fn resolved_info(&self, frame: FrameRef) -> Option<&FrameInfo> {
        if !is_resolved_frame(frame) {
            return None;
        }
        self.resolved.get(resolved_frame_index(frame))?.as_ref()
    }

    /// Replaces the Ruby frames that `names` names (a flush's resolution) by
    /// resolved frames, in every stack stored with Ruby frames since the
    /// last call. A stack that becomes equal to one already stored is merged
    /// into it: the returned vector, indexed by stack id, gives the id its
    /// samples must move to (`NO_STACK` for the others; empty if none
    /// merged). For a table no sample refers to (this file's tests): every
    /// forwarding, this call's and any earlier one's, ends at once.
    /// Frames `names` lacks (stacks taken while the flush ran) stay Ruby
    /// frames until the next call.
    ///
    /// Runs under the sampler lock with the GVL held, at every flush, so it
    /// works on frame slots: names are hashed once per distinct frame, and
    /// each stack position costs an array lookup and a use count.
    #[cfg(test)]
    pub fn detach_frames(&mut self, names: &FastHashMap<FrameRef, FrameInfo>) -> Vec<u32> {
        self.begin_detach();
        self.detach_batch(names, usize::MAX);
        let mut moved = Vec::new();
        if !self.forward.is_empty() {
            moved = vec![NO_STACK; self.entries.len()];
            for &from in self.forward.keys() {
                moved[from as usize] = self.forwarded(StackId(from)).0;
            }
        }
        self.end_forwarding();
        moved
    }

    /// Where the samples of stack `id` are now: itself, or the stack it
    /// was merged into by a detach whose samples have not all moved yet
    /// (the one in progress, or one a flush cut short, whose samples the
    /// next detach moves).
    pub fn forwarded(&self, id: StackId) -> StackId {
        if self.forward.is_empty() {
            return id;
        }
        let mut id = id.0;
        while let Some(&to) = self.forward.get(&id) {
            id = to;
        }
        StackId(id)
    }

    /// Merged stacks whose samples have not all been moved yet.
    pub fn is_forwarding(&self) -> bool {
        !self.forward.is_empty()
    }

    /// Every sample holding a merged id has been moved: the ids may be
    /// reused.
    pub fn end_forwarding(&mut self) {
        self.forward.clear();
        let merged = std::mem::take(&mut self.merged_ids);
        self.free_ids.extend(merged);
    }

    /// Queues every stack stored with Ruby frames for `detach_batch`.
    pub fn begin_detach(&mut self) {
        let mut new = std::mem::take(&mut self.with_ruby_frames);
        for &id in &new {
            self.ruby_listed[id as usize] = false;
        }
        // Only ids of stacks stored now: a stale id (its stack pruned) could
        // otherwise be taken by a stack interned between two batches, whose
        // frames may be new objects at addresses `names` knew as others.
        // Stored ones stay occupied until the detach ends (merged ids wait).
        // (Each id is listed once: no need to sort a million of them.)
        new.retain(|&id| matches!(self.entries.get(id as usize), Some(Some(_))));
        self.detach_queue.extend(new);
    }

    /// `detach_frames` for at most `max_stacks` of the queued stacks, so a
    /// caller can let other threads run in between. Returns whether the
    /// queue is empty. Between batches the frames still queued stay Ruby
    /// frames, held and marked as before. Merged ids are forwarded until
    /// the caller has moved their samples (`forwarded`, `end_forwarding`).
    pub fn detach_batch(
        &mut self,
        names: &FastHashMap<FrameRef, FrameInfo>,
        max_stacks: usize,
    ) -> bool {
        // Old Ruby-frame slot -> its resolved slot (NO_SLOT: not named).
        let mut slot_map: Vec<u32> = Vec::new();
        let mut resolved_of: FastHashMap<FrameRef, FrameRef> = FastHashMap::default();
        let mut old_ids: Vec<u32> = Vec::new();
        let mut new_ids: Vec<u32> = Vec::new();
        let take = self.detach_queue.len().min(max_stacks);
        let batch: Vec<u32> = self
            .detach_queue
            .drain(self.detach_queue.len() - take..)
            .collect();
        for slot in batch {
            let Some(entry) = self.entries.get(slot as usize).and_then(Option::as_ref) else {
                continue; // pruned since
            };
            if entry.refs == 0 {
                // Unused: pruned at the end of this flush, unless a new
                // sample takes it again first (then it is converted later).
                self.list_ruby(slot);
                continue;
            }
            old_ids.clear();
            old_ids.extend_from_slice(self.ids.get(entry.frames));
            new_ids.clear();
            let mut changed = false;
            let mut still_ruby = false;
            for &id in old_ids.iter() {
                let frame = self.frame_slots[id as usize].frame;
                if frame.frame == TRUNCATION_FRAME || is_resolved_frame(frame.frame) {
                    new_ids.push(id);
                    continue;
                }
                if slot_map.len() <= id as usize {
                    slot_map.resize(self.frame_slots.len().max(id as usize + 1), NO_SLOT);
                }
                if slot_map[id as usize] == NO_SLOT {
                    if let Some(info) = names.get(&frame.frame) {
                        let resolved = match resolved_of.get(&frame.frame) {
                            Some(&r) => r,
                            None => {
                                let r = self.resolved_frame(info);
                                resolved_of.insert(frame.frame, r);
                                r
                            }
                        };
                        slot_map[id as usize] = self.ensure_slot(Frame {
                            frame: resolved,
                            line: frame.line,
                        });
                    }
                }
                match slot_map.get(id as usize).copied().filter(|&n| n != NO_SLOT) {
                    Some(new) => {
                        changed = true;
                        new_ids.push(new);
                    }
                    None => {
                        still_ruby = true;
                        new_ids.push(id);
                    }
                }
            }
            if !changed {
                self.list_ruby(slot);
                continue;
            }
            let frames: Vec<Frame> = new_ids
                .iter()
                .map(|&id| self.frame_slots[id as usize].frame)
                .collect();
            let hash = hash_frames(&frames);
            let existing = self.find_stack(hash, &new_ids);
            let old_entry = self.entries[slot as usize].take().expect("checked above");
            self.unlink(slot, &old_entry);
            match existing {
                Some(target) => {
                    // Merge: the stored stack takes over the references.
                    for &id in old_ids.iter() {
                        self.release_frame(id);
                    }
                    self.ids.remove(old_entry.frames);
                    self.positions -= old_ids.len();
                    self.stacks -= 1;
                    self.merged_ids.push(slot);
                    self.entry_mut(StackId(target)).refs += old_entry.refs;
                    self.forward.insert(slot, target);
                }
                None => {
                    // Rewrite in place: same id, new frames.
                    for (&old, &new) in old_ids.iter().zip(new_ids.iter()) {
                        self.frame_slots[new as usize].uses += 1;
                        self.release_frame(old);
                    }
                    self.ids.get_mut(old_entry.frames).copy_from_slice(&new_ids);
                    let next_same_hash = self.by_hash.get(&hash).copied().unwrap_or(NO_STACK);
                    self.entries[slot as usize] = Some(StackEntry {
                        frames: old_entry.frames,
                        hash,
                        refs: old_entry.refs,
                        next_same_hash,
                    });
                    self.by_hash.insert(hash, slot);
                    if still_ruby {
                        self.list_ruby(slot);
                    }
                }
            }
        }
        self.detach_queue.is_empty()
    }

    /// A detach that will not be finished (its flush failed): what is still
    /// queued waits for the next one. (Merged ids stay forwarded until the
    /// caller has moved their samples.)
    pub fn end_detach(&mut self) {
        for slot in std::mem::take(&mut self.detach_queue) {
            self.list_ruby(slot);
        }
    }

    /// The stored stack with these frame slot ids, if any.
    fn find_stack(&self, hash: u64, ids: &[u32]) -> Option<u32> {
        let mut candidate = self.by_hash.get(&hash).copied().unwrap_or(NO_STACK);
        while candidate != NO_STACK {
            let entry = self.entries[candidate as usize]
                .as_ref()
                .expect("hash chains hold stored stacks");
            if self.ids.get(entry.frames) == ids {
                return Some(candidate);
            }
            candidate = entry.next_same_hash;
        }
        None
    }

    /// The slot of a (frame, line), created with no uses if new.
    fn ensure_slot(&mut self, frame: Frame) -> u32 {
        let id = self.frame_id(frame);
        self.frame_slots[id as usize].uses -= 1;
        id
    }

    pub fn retain(&mut self, id: StackId) {
        let id = self.forwarded(id);
        self.entry_mut(id).refs += 1;
    }

    /// Drops one reference; the stack goes with its last, or waits in the
    /// queue while pruning is held (see the top).
    pub fn release(&mut self, id: StackId) {
        let id = self.forwarded(id);
        let entry = self.entry_mut(id);
        debug_assert!(entry.refs > 0, "stack released more often than retained");
        entry.refs = entry.refs.saturating_sub(1);
        if entry.refs > 0 {
            return;
        }
        if self.prune_held {
            self.unused.push(id.0);
            return;
        }
        self.remove_if_unused(id.0);
    }

    /// A flush begins: stack ids and frames stay as they are until
    /// `release_pruning`.
    pub fn hold_pruning(&mut self) {
        self.prune_held = true;
    }

    /// The flush ended: stacks go with their last reference again; of
    /// those that fell unused meanwhile, `max` are removed now and the rest
    /// wait for `drain_unused`.
    pub fn release_pruning(&mut self, max: usize) {
        self.prune_held = false;
        self.drain_unused(max);
    }

    /// Stacks waiting to be removed.
    pub fn unused_len(&self) -> usize {
        self.unused.len()
    }

    /// Removes up to `max` of the stacks queued while pruning was held
    /// (none while it is). True when the queue is empty.
    pub fn drain_unused(&mut self, max: usize) -> bool {
        if self.prune_held {
            return self.unused.is_empty();
        }
        for _ in 0..max {
            match self.unused.pop() {
                Some(slot) => self.remove_if_unused(slot),
                None => break,
            }
        }
        if self.unused.is_empty() && self.unused.capacity() > 1024 {
            self.unused = Vec::new();
        }
        self.unused.is_empty()
    }

    /// Removes the stack stored at `slot` if no sample uses it (it may
    /// have been removed already, or its id reused by a stack in use).
    fn remove_if_unused(&mut self, slot: u32) {
        let unused =
            matches!(self.entries.get(slot as usize), Some(Some(entry)) if entry.refs == 0);
        if !unused {
            return;
        }
        let entry = self.entries[slot as usize].take().expect("checked above");
        self.unlink(slot, &entry);
        for position in 0..entry.frames.len() {
            let frame = self.ids.get(entry.frames)[position];
            self.release_frame(frame);
        }
        self.ids.remove(entry.frames);
        self.positions -= entry.frames.len();
        self.stacks -= 1;
        self.free_ids.push(slot);
    }

    /// Queues `slot` for the next detach, once.
    fn list_ruby(&mut self, slot: u32) {
        let index = slot as usize;
        if self.ruby_listed.len() <= index {
            self.ruby_listed
                .resize(self.entries.len().max(index + 1), false);
        }
        if !self.ruby_listed[index] {
            self.ruby_listed[index] = true;
            self.with_ruby_frames.push(slot);
        }
    }

    /// The stack's frames, leaf first.
    pub fn frames(&self, id: StackId) -> Arc<[Frame]> {
        self.ids
            .get(self.entry(self.forwarded(id)).frames)
            .iter()
            .map(|&frame| self.frame_slots[frame as usize].frame)
            .collect()
    }

    #[cfg(test)]
    pub fn total_refs(&self) -> u64 {
        self.entries
            .iter()
            .flatten()
            .map(|e| u64::from(e.refs))
            .sum()
    }

    #[cfg(test)]
    pub fn refs(&self, id: StackId) -> u32 {
        self.entry(self.forwarded(id)).refs
    }

    /// Removes every stack no sample refers to (the queue included).
    /// Returns how many were removed.
    pub fn prune(&mut self) -> usize {
        let before = self.stacks;
        self.unused.clear();
        for slot in 0..self.entries.len() {
            self.remove_if_unused(slot as u32);
        }
        before - self.stacks
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

    /// Every Ruby frame some stored stack contains: what the GC must keep
    /// alive (resolved frames are held by name, not by Ruby object).
    pub fn live_frames(&self) -> impl Iterator<Item = FrameRef> + '_ {
        self.frame_refs
            .keys()
            .copied()
            .filter(|&f| f != TRUNCATION_FRAME && !is_resolved_frame(f))
    }

    pub fn len(&self) -> usize {
        self.stacks
    }

    /// Distinct Ruby frames the stored stacks hold (each keeps a Ruby
    /// object alive).
    pub fn frame_count(&self) -> usize {
        self.live_frames().count()
    }

    /// Distinct frames held by name.
    pub fn resolved_frame_count(&self) -> usize {
        self.resolved_by_info.len()
    }

    pub fn is_empty(&self) -> bool {
        self.stacks == 0
    }

    /// Approximate heap bytes used, for `ObjectSpace.memsize_of`.
    pub fn memory_bytes(&self) -> usize {
        use std::mem::size_of;
        self.entries.capacity() * size_of::<Option<StackEntry>>()
            + self.ids.memory_bytes()
            + self.interning.capacity() * size_of::<u32>()
            + self.free_ids.capacity() * size_of::<u32>()
            + self.by_hash.capacity() * (size_of::<u64>() + size_of::<u32>() + 4)
            + self.frame_slots.capacity() * size_of::<FrameSlot>()
            + self.free_frame_slots.capacity() * size_of::<u32>()
            + self.frame_ids.capacity() * (size_of::<Frame>() + size_of::<u32>() + 4)
            + self.frame_refs.capacity() * (size_of::<FrameRef>() + size_of::<u32>() + 4)
            + (self.with_ruby_frames.capacity()
                + self.detach_queue.capacity()
                + self.merged_ids.capacity()
                + 3 * self.forward.capacity()
                + self.unused.capacity())
                * size_of::<u32>()
            + self.ruby_listed.capacity()
            + self.resolved.capacity() * size_of::<Option<FrameInfo>>()
            + self.resolved_by_info.capacity()
                * (size_of::<FrameInfo>() + size_of::<FrameRef>() + 4)
            + self
                .resolved
                .iter()
                .flatten()
                .map(|info| 2 * (info.name.len() + info.filename.as_ref().map_or(0, String::len)))
                .sum::<usize>()
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
            .map(|&(frame, line)| Frame {
                frame: FrameRef(frame),
                line,
            })
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
    fn a_stack_goes_with_its_last_reference_and_its_frames_with_it() {
        let mut table = StackTable::new();
        let kept = table.intern(&stack(&[(8, 1), (16, 2)]));
        let dropped = table.intern(&stack(&[(24, 1), (16, 2)]));
        table.release(dropped);
        assert_eq!(table.len(), 1);
        let mut frames: Vec<_> = table.live_frames().collect();
        frames.sort();
        assert_eq!(frames, vec![8, 16]);
        assert_eq!(table.refs(kept), 1);
        assert_eq!(table.prune(), 0);
    }

    /// While a flush runs, ids and frames stay as its snapshot saw them;
    /// after, the queue is drained in chunks, and stacks go with their last
    /// reference again.
    #[test]
    fn stacks_unused_while_pruning_is_held_wait_then_drain_in_chunks() {
        let mut table = StackTable::new();
        let kept = table.intern(&stack(&[(8, 1)]));
        table.hold_pruning();
        let ids: Vec<StackId> = (0..10)
            .map(|i| table.intern(&stack(&[(40 + 8 * i, 1), (16, 2)])))
            .collect();
        for &id in &ids {
            table.release(id);
        }
        assert_eq!(table.len(), 11);
        assert_eq!(table.frames(ids[3]).len(), 2, "still resolvable");
        assert!(!table.drain_unused(usize::MAX), "nothing goes while held");
        // A queued stack taken again is not removed.
        let again = table.intern(&stack(&[(40, 1), (16, 2)]));
        assert_eq!(again, ids[0]);
        table.release_pruning(3);
        assert_eq!(table.len(), 8);
        assert_eq!(table.unused_len(), 7);
        // A release removes its own stack at once, and only that.
        let other = table.intern(&stack(&[(1000, 1)]));
        table.release(other);
        assert_eq!(table.unused_len(), 7);
        assert_eq!(table.len(), 8);
        assert!(table.drain_unused(usize::MAX));
        assert_eq!(table.len(), 2, "kept and again");
        assert_eq!(table.refs(kept), 1);
        assert_eq!(table.refs(again), 1);
        let mut frames: Vec<_> = table.live_frames().collect();
        frames.sort();
        assert_eq!(frames, vec![8, 16, 40]);
    }

    /// Random interns, releases, held pruning, drains, prunes and detaches
    /// against a plain model (stack id -> original frames, refs): every
    /// held stack keeps its frames (through the shared id pages), and
    /// once none is held the table and its pages are empty again.
    #[test]
    fn random_use_matches_a_plain_model() {
        use std::collections::HashMap;
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let mut table = StackTable::new();
        // id -> (original Ruby frames, refs held)
        let mut model: HashMap<StackId, (Vec<Frame>, u32)> = HashMap::new();
        let canonical = |table: &StackTable, frames: &[Frame]| -> Vec<(u64, i32)> {
            frames
                .iter()
                .map(|f| match table.resolved_info(f.frame) {
                    Some(info) => (info.name[1..].parse::<u64>().unwrap(), f.line),
                    None => (f.frame.0, f.line),
                })
                .collect()
        };
        for round in 0..12_000u32 {
            match next(20) {
                0..=9 => {
                    let len = match next(4) {
                        0 => next(4) as usize,
                        1 => next(70) as usize,
                        2 => 250 + next(20) as usize,
                        _ => next(700) as usize,
                    };
                    let frames: Vec<Frame> = (0..len)
                        .map(|_| Frame {
                            frame: FrameRef(0x1000 + 8 * next(12)),
                            line: next(3) as i32,
                        })
                        .collect();
                    let id = table.intern(&frames);
                    let entry = model.entry(id).or_insert_with(|| (frames.clone(), 0));
                    assert_eq!(
                        canonical(&table, &entry.0),
                        canonical(&table, &frames),
                        "round {round}: interned into another stack"
                    );
                    entry.1 += 1;
                }
                10..=15 if !model.is_empty() => {
                    let keys: Vec<StackId> = model.keys().copied().collect();
                    let id = keys[next(keys.len() as u64) as usize];
                    table.release(id);
                    let entry = model.get_mut(&id).unwrap();
                    entry.1 -= 1;
                    if entry.1 == 0 {
                        model.remove(&id);
                    }
                }
                16 => table.hold_pruning(),
                17 => table.release_pruning(next(50) as usize),
                18 => {
                    let _ = table.drain_unused(next(50) as usize);
                }
                _ => {
                    if table.prune_held {
                        continue;
                    }
                    // Name every frame "n<address>": equal names, equal frames.
                    let names: FastHashMap<FrameRef, FrameInfo> = (0..12u64)
                        .filter(|_| next(3) > 0)
                        .map(|k| {
                            let frame = 0x1000 + 8 * k;
                            let info = FrameInfo {
                                name: format!("n{frame}"),
                                filename: None,
                                start_line: 0,
                                blocks: None,
                            };
                            (FrameRef(frame), info)
                        })
                        .collect();
                    let moved = table.detach_frames(&names);
                    if !moved.is_empty() {
                        let old: Vec<(StackId, (Vec<Frame>, u32))> = model.drain().collect();
                        for (id, (frames, refs)) in old {
                            let to = StackId::from_stored(moved[id.index()]).unwrap_or(id);
                            let entry = model.entry(to).or_insert_with(|| (frames, 0));
                            entry.1 += refs;
                        }
                    }
                }
            }
            if round % 97 == 0 || model.len() < 3 {
                let mut held = 0;
                for (&id, (frames, refs)) in &model {
                    assert_eq!(table.refs(id), *refs, "round {round}: refs of {id:?}");
                    assert_eq!(
                        canonical(&table, &table.frames(id)),
                        canonical(&table, frames),
                        "round {round}: frames of {id:?}"
                    );
                    held += 1;
                }
                if !table.prune_held {
                    table.drain_unused(usize::MAX);
                    assert_eq!(table.len(), held, "round {round}: stacks stored");
                }
            }
        }
        let ids: Vec<(StackId, u32)> = model.iter().map(|(&id, e)| (id, e.1)).collect();
        table.release_pruning(0);
        for (id, refs) in ids {
            for _ in 0..refs {
                table.release(id);
            }
        }
        table.prune();
        assert!(table.is_empty());
        assert_eq!(table.live_frames().count(), 0);
        assert_eq!(table.resolved_frame_count(), 0);
        assert_eq!(table.positions, 0);
        assert_eq!(table.ids.page_words(), 0, "pages left behind");
        assert!(table.ids.memory_bytes() < 8 * 1024);
    }

    #[test]
    fn churning_stacks_are_listed_for_detach_once_per_id() {
        let mut table = StackTable::new();
        for i in 0..1_000 {
            let id = table.intern(&stack(&[(8 * (i + 1), 1)]));
            table.release(id);
        }
        assert_eq!(table.len(), 0);
        assert_eq!(table.with_ruby_frames.len(), 1);
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
        table.intern(&stack(&[(8, 1), (TRUNCATION_FRAME.0, 0)]));
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

    fn named(entries: &[(u64, &str)]) -> FastHashMap<FrameRef, FrameInfo> {
        entries
            .iter()
            .map(|&(frame, name)| {
                let info = FrameInfo {
                    name: name.to_string(),
                    filename: Some("app.rb".to_string()),
                    start_line: 1,
                    blocks: None,
                };
                (FrameRef(frame), info)
            })
            .collect()
    }

    #[test]
    fn detached_frames_are_held_by_name_and_equal_stacks_merge() {
        let mut table = StackTable::new();
        let first = table.intern(&stack(&[(0x100, 1), (0x200, 2)]));
        let moved = table.detach_frames(&named(&[(0x100, "A#a"), (0x200, "B#b")]));
        assert!(moved.is_empty(), "rewritten in place, nothing merged");
        let resolved = first;
        assert_eq!(table.live_frames().count(), 0, "no Ruby object kept alive");
        assert_eq!(table.resolved_frame_count(), 2);
        let names: Vec<String> = table
            .frames(resolved)
            .iter()
            .map(|f| table.resolved_info(f.frame).expect("named").name.clone())
            .collect();
        assert_eq!(names, ["A#a", "B#b"]);

        // The same code path sampled again, one method entry now at another
        // address: a Ruby-frame stack until the next flush names it, then
        // the same stack as before.
        let again = table.intern(&stack(&[(0x300, 1), (0x200, 2)]));
        assert_eq!(table.live_frames().count(), 2);
        let moved = table.detach_frames(&named(&[(0x300, "A#a"), (0x200, "B#b")]));
        assert_eq!(StackId::from_stored(moved[again.index()]), Some(resolved));
        assert_eq!(table.refs(resolved), 2);
        assert_eq!(table.len(), 1);
        assert_eq!(table.live_frames().count(), 0);

        // Once no sample uses it, the stack and its names go.
        table.release(resolved);
        table.release(resolved);
        table.prune();
        assert!(table.is_empty());
        assert_eq!(table.resolved_frame_count(), 0);
    }

    #[test]
    fn frames_a_flush_did_not_name_stay_ruby_frames_until_a_later_one() {
        let mut table = StackTable::new();
        let id = table.intern(&stack(&[(0x100, 1), (0x200, 2), (TRUNCATION_FRAME.0, 0)]));
        // Taken while the flush ran: only one of its frames was named.
        assert!(table.detach_frames(&named(&[(0x100, "A#a")])).is_empty());
        assert_eq!(table.live_frames().collect::<Vec<_>>(), [0x200]);
        assert!(table.detach_frames(&named(&[(0x200, "B#b")])).is_empty());
        assert_eq!(table.live_frames().count(), 0);
        assert_eq!(table.frames(id)[2].frame, TRUNCATION_FRAME);
        assert_eq!(table.refs(id), 1);
        // Nothing left to name: nothing moves.
        assert!(table.detach_frames(&named(&[])).is_empty());
    }
}
