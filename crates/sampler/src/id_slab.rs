//! The frame id lists of stored stacks, kept in shared pages by length
//! class rather than in one allocation each. A program of a million
//! distinct stacks otherwise made a million small allocations; freeing them
//! left glibc's malloc that many small chunks, which it consolidates inside
//! the next large allocation, wherever in the process that is: tens of
//! milliseconds with the GVL held (docs/performance.md, "Flush pauses").
//!
//! A list is stored in a block of its length class (lengths rounded up, so
//! a block is reused by lists of nearby lengths). Free blocks are chained
//! through their own first two words. A class's pages go when its last
//! block does; until then they stay for the next lists of that class, so
//! the slab's size follows the peak of what the stack table holds.

/// Where a list is stored: its class, page and word offset, and its length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlabSpan {
    class: u32,
    page: u32,
    offset: u32,
    len: u32,
}

impl SlabSpan {
    pub fn len(self) -> usize {
        self.len as usize
    }

    pub fn is_empty(self) -> bool {
        self.len == 0
    }
}

/// The first page of a class holds this many words (or one block), and
/// each next page twice the previous, up to `MAX_PAGE_WORDS`: a class a
/// program barely uses costs about a kilobyte.
const FIRST_PAGE_WORDS: usize = 256;
const MAX_PAGE_WORDS: usize = 16 * 1024;

/// Marks the end of a free chain.
const NO_PAGE: u32 = u32::MAX;

#[derive(Debug, Default)]
struct SizeClass {
    pages: Vec<Box<[u32]>>,
    /// Words of the last page handed out so far.
    last_page_used: usize,
    /// The first free block (page, offset), chained through free blocks.
    free: (u32, u32),
    blocks_used: usize,
}

#[derive(Debug, Default)]
pub struct IdSlab {
    classes: Vec<SizeClass>,
    words: usize,
}

/// Block words of class `class`: multiples of 4 up to 64, of 8 up to 256,
/// of 32 beyond (rounding takes under an eighth of a block for lists of 32
/// ids or more).
fn block_words(class: usize) -> usize {
    match class {
        0..=15 => 4 * (class + 1),
        16..=39 => 64 + 8 * (class - 15),
        _ => 256 + 32 * (class - 39),
    }
}

fn class_of(len: usize) -> usize {
    match len {
        0..=64 => len.max(1).div_ceil(4) - 1,
        65..=256 => 15 + (len - 64).div_ceil(8),
        _ => 39 + (len - 256).div_ceil(32),
    }
}

impl IdSlab {
    pub fn new() -> Self {
        Self::default()
    }

    /// Stores `ids` and returns where.
    pub fn insert(&mut self, ids: &[u32]) -> SlabSpan {
        let class = class_of(ids.len());
        if self.classes.len() <= class {
            self.classes.resize_with(class + 1, || SizeClass {
                free: (NO_PAGE, 0),
                ..SizeClass::default()
            });
        }
        let words = block_words(class);
        let size_class = &mut self.classes[class];
        let (page, offset) = if size_class.free.0 != NO_PAGE {
            let (page, offset) = size_class.free;
            let block = &size_class.pages[page as usize][offset as usize..];
            size_class.free = (block[0], block[1]);
            (page, offset)
        } else {
            let room = size_class
                .pages
                .last()
                .map_or(0, |p| p.len() - size_class.last_page_used);
            if room < words {
                let previous = size_class.pages.last().map_or(0, |p| p.len());
                let page_words = (previous * 2)
                    .clamp(FIRST_PAGE_WORDS, MAX_PAGE_WORDS)
                    .max(words)
                    / words
                    * words;
                size_class
                    .pages
                    .push(vec![0; page_words].into_boxed_slice());
                size_class.last_page_used = 0;
                self.words += page_words;
            }
            let offset = size_class.last_page_used;
            size_class.last_page_used += words;
            (size_class.pages.len() as u32 - 1, offset as u32)
        };
        size_class.blocks_used += 1;
        size_class.pages[page as usize][offset as usize..offset as usize + ids.len()]
            .copy_from_slice(ids);
        SlabSpan {
            class: class as u32,
            page,
            offset,
            len: ids.len() as u32,
        }
    }

    pub fn get(&self, span: SlabSpan) -> &[u32] {
        let start = span.offset as usize;
        &self.classes[span.class as usize].pages[span.page as usize][start..start + span.len()]
    }

    pub fn get_mut(&mut self, span: SlabSpan) -> &mut [u32] {
        let start = span.offset as usize;
        &mut self.classes[span.class as usize].pages[span.page as usize][start..start + span.len()]
    }

    /// Frees the block of `span` (which must not be used again).
    pub fn remove(&mut self, span: SlabSpan) {
        let size_class = &mut self.classes[span.class as usize];
        size_class.blocks_used -= 1;
        if size_class.blocks_used == 0 {
            let words: usize = size_class.pages.iter().map(|p| p.len()).sum();
            self.words -= words;
            *size_class = SizeClass {
                free: (NO_PAGE, 0),
                ..SizeClass::default()
            };
            return;
        }
        let next = size_class.free;
        let block = &mut size_class.pages[span.page as usize][span.offset as usize..];
        block[0] = next.0;
        block[1] = next.1;
        size_class.free = (span.page, span.offset);
    }

    /// Words of the pages held (test-only: to find pages left behind).
    #[cfg(test)]
    pub fn page_words(&self) -> usize {
        self.words
    }

    /// Heap bytes held.
    pub fn memory_bytes(&self) -> usize {
        use std::mem::size_of;
        self.words * size_of::<u32>()
            + self.classes.capacity() * size_of::<SizeClass>()
            + self
                .classes
                .iter()
                .map(|c| c.pages.capacity() * size_of::<Box<[u32]>>())
                .sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_cover_every_length_with_little_rounding() {
        for len in 0..5_000 {
            let class = class_of(len);
            assert!(block_words(class) >= len.max(1), "{len}");
            if class > 0 {
                assert!(block_words(class - 1) < len, "{len}: a smaller class fits");
            }
            assert!(block_words(class) <= len + 31, "{len}");
            if len >= 32 {
                assert!(block_words(class) * 8 <= len * 9, "{len}");
            }
        }
    }

    #[test]
    fn lists_come_back_as_stored_and_freed_blocks_are_reused() {
        let mut slab = IdSlab::new();
        let a = slab.insert(&[1, 2, 3]);
        let b = slab.insert(&[4, 5, 6, 7, 8]);
        let c = slab.insert(&[9, 10]);
        let empty = slab.insert(&[]);
        assert_eq!(slab.get(a), [1, 2, 3]);
        assert_eq!(slab.get(b), [4, 5, 6, 7, 8]);
        assert_eq!(slab.get(c), [9, 10]);
        assert!(slab.get(empty).is_empty());
        slab.remove(a);
        assert_eq!(slab.get(c), [9, 10], "a neighbour is untouched");
        let d = slab.insert(&[11, 12, 13, 14]);
        assert_eq!((d.page, d.offset), (a.page, a.offset), "a's block reused");
        slab.get_mut(d)[0] = 99;
        assert_eq!(slab.get(d), [99, 12, 13, 14]);
        assert_eq!(slab.get(c), [9, 10]);
    }

    #[test]
    fn a_class_gives_its_pages_back_with_its_last_block() {
        let mut slab = IdSlab::new();
        let long: Vec<u32> = (0..40).collect();
        let spans: Vec<_> = (0..10_000).map(|_| slab.insert(&long)).collect();
        let small = slab.insert(&[1]);
        let full = slab.memory_bytes();
        assert!(full >= 10_000 * 40 * 4);
        assert!(full <= 10_000 * 44 * 4 * 11 / 10 + 16 * 1024, "{full}");
        for (i, &span) in spans.iter().enumerate() {
            assert_eq!(slab.get(span), &long[..], "{i}");
        }
        for span in spans {
            slab.remove(span);
        }
        assert!(slab.memory_bytes() < 4096, "{}", slab.memory_bytes());
        assert_eq!(slab.get(small), [1]);
    }

    /// Random inserts and removes against a plain copy of each list.
    #[test]
    fn random_use_keeps_every_list_intact() {
        let mut slab = IdSlab::new();
        let mut held: Vec<(SlabSpan, Vec<u32>)> = Vec::new();
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for round in 0..20_000u32 {
            if held.is_empty() || next(3) > 0 {
                let len = next(300) as usize;
                let ids: Vec<u32> = (0..len as u32).map(|i| i ^ round).collect();
                held.push((slab.insert(&ids), ids));
            } else {
                let (span, ids) = held.swap_remove(next(held.len() as u64) as usize);
                assert_eq!(slab.get(span), &ids[..]);
                slab.remove(span);
            }
        }
        for (span, ids) in &held {
            assert_eq!(slab.get(*span), &ids[..]);
        }
    }
}
