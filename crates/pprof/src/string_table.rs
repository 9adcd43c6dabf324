//! Interning of strings into a pprof string table: each distinct string is
//! stored once and referred to by its index; index 0 is always "".

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault};

use sampler::fast_hash::FastHasher;
use sampler::heap_size;

const INDEX_ENTRY: usize = std::mem::size_of::<(String, i64)>();

/// The table. Its index hashes with FxHash by default (the strings of our
/// own profiles); a reader of files others made uses std's randomly keyed
/// SipHash (`StringTable<RandomState>`, see `analysis::InputMap`), so that
/// crafted strings cannot all collide.
#[derive(Debug)]
pub struct StringTable<S = BuildHasherDefault<FastHasher>> {
    strings: Vec<String>,
    index: HashMap<String, i64, S>,
    /// Bytes of the strings (each stored twice: in order, and as a key).
    bytes: usize,
}

impl<S: BuildHasher + Default> Default for StringTable<S> {
    fn default() -> Self {
        Self::new()
    }
}

impl<S: BuildHasher + Default> StringTable<S> {
    pub fn new() -> Self {
        let mut table = StringTable {
            strings: Vec::new(),
            index: HashMap::default(),
            bytes: 0,
        };
        table.intern("");
        table
    }

    /// The index of `s`, adding it if it is new.
    pub fn intern(&mut self, s: &str) -> i64 {
        if let Some(&index) = self.index.get(s) {
            return index;
        }
        let index = self.strings.len() as i64;
        self.strings.push(s.to_owned());
        self.index.insert(s.to_owned(), index);
        self.bytes += s.len();
        index
    }

    /// Heap bytes held.
    pub fn memory_bytes(&self) -> usize {
        heap_size::vec_bytes(&self.strings)
            + heap_size::map_bytes(self.index.capacity(), INDEX_ENTRY)
            + 2 * (self.bytes + self.strings.len() * heap_size::BLOCK_OVERHEAD)
    }

    /// Bytes of the strings held (each once).
    pub fn string_bytes(&self) -> usize {
        self.bytes
    }

    /// Room for `incoming` more strings without growing while they are
    /// interned.
    pub fn reserve(&mut self, incoming: usize) {
        self.strings.reserve(incoming);
        self.index.reserve(incoming);
    }

    /// What `reserve(incoming)` and then interning `incoming` new strings
    /// of `bytes` in all can allocate.
    pub fn growth_bytes(&self, incoming: usize, bytes: usize) -> usize {
        heap_size::vec_growth(&self.strings, incoming)
            + heap_size::map_growth(
                self.index.len(),
                self.index.capacity(),
                incoming,
                INDEX_ENTRY,
            )
            + 2 * bytes
    }

    pub fn len(&self) -> usize {
        self.strings.len()
    }

    pub fn is_empty(&self) -> bool {
        // Never true: "" is always present. Provided for clippy's sake.
        self.strings.is_empty()
    }

    pub fn get(&self, index: i64) -> Option<&str> {
        usize::try_from(index)
            .ok()
            .and_then(|i| self.strings.get(i))
            .map(String::as_str)
    }

    pub fn into_strings(self) -> Vec<String> {
        self.strings
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_string_is_index_zero() {
        let mut table: StringTable = StringTable::new();
        assert_eq!(table.get(0), Some(""));
        assert_eq!(table.intern(""), 0);
        assert_eq!(table.len(), 1);
    }

    #[test]
    fn same_string_interns_once() {
        let mut table: StringTable = StringTable::new();
        let a = table.intern("Foo#bar");
        let b = table.intern("app.rb");
        assert_eq!(table.intern("Foo#bar"), a);
        assert_ne!(a, b);
        assert_eq!(table.len(), 3);
        assert_eq!(table.into_strings(), vec!["", "Foo#bar", "app.rb"]);
    }

    #[test]
    fn out_of_range_lookup_is_none() {
        let table: StringTable = StringTable::new();
        assert_eq!(table.get(1), None);
        assert_eq!(table.get(-1), None);
    }
}
