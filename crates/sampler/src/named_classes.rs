//! Classes held by name. A sample keeps its object's class (for the `class`
//! label) as a Ruby object, which the collector marks, until a flush has
//! named it; from then on it holds the name instead. Otherwise a class that
//! refers to its own sampled instance (a memoized default instance, a
//! class-level cache) would be kept alive by the sample, and the instance by
//! the class, for as long as the profiler runs: classes made at run time
//! would leak with everything they hold.

use super::types::{is_named_class, named_class, named_class_index, ClassRef};
use crate::fast_hash::FastHashMap;

#[derive(Debug)]
struct NamedClass {
    name: String,
    /// Sample records holding this handle.
    holders: u32,
}

/// Names of classes held by name, refcounted by the samples that hold them.
#[derive(Debug, Default)]
pub struct NamedClasses {
    entries: Vec<Option<NamedClass>>,
    free: Vec<u32>,
    by_name: FastHashMap<String, ClassRef>,
}

impl NamedClasses {
    /// The handle for `name` (the same for the same name), one more holder
    /// taken on it.
    pub fn acquire(&mut self, name: &str) -> ClassRef {
        if let Some(&class) = self.by_name.get(name) {
            if let Some(entry) = self.entry_mut(class) {
                entry.holders += 1;
            }
            return class;
        }
        let entry = NamedClass {
            name: name.to_string(),
            holders: 1,
        };
        let index = match self.free.pop() {
            Some(index) => {
                self.entries[index as usize] = Some(entry);
                index
            }
            None => {
                let index = u32::try_from(self.entries.len()).expect("fewer than 2^32 classes");
                self.entries.push(Some(entry));
                index
            }
        };
        let class = named_class(index);
        self.by_name.insert(name.to_string(), class);
        class
    }

    /// One more holder of a named class (a flush that will name it after its
    /// samples may have gone); other handles are ignored.
    pub fn hold(&mut self, class: ClassRef) {
        if !is_named_class(class) {
            return;
        }
        if let Some(entry) = self.entry_mut(class) {
            entry.holders += 1;
        }
    }

    /// Drops one holder of a named class; the name goes with the last one.
    /// Other handles are ignored.
    pub fn release(&mut self, class: ClassRef) {
        if !is_named_class(class) {
            return;
        }
        let Some(entry) = self.entry_mut(class) else {
            return;
        };
        entry.holders -= 1;
        if entry.holders == 0 {
            let index = named_class_index(class);
            if let Some(entry) = self.entries[index].take() {
                self.by_name.remove(&entry.name);
            }
            self.free.push(index as u32);
        }
    }

    pub fn name(&self, class: ClassRef) -> Option<&str> {
        if !is_named_class(class) {
            return None;
        }
        self.entries
            .get(named_class_index(class))?
            .as_ref()
            .map(|e| e.name.as_str())
    }

    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    pub fn memory_bytes(&self) -> usize {
        use std::mem::size_of;
        self.entries.capacity() * size_of::<Option<NamedClass>>()
            + self.free.capacity() * size_of::<u32>()
            + self.by_name.capacity() * (size_of::<String>() + size_of::<ClassRef>() + 4)
            + self
                .entries
                .iter()
                .flatten()
                .map(|e| 2 * e.name.len())
                .sum::<usize>()
    }

    fn entry_mut(&mut self, class: ClassRef) -> Option<&mut NamedClass> {
        self.entries.get_mut(named_class_index(class))?.as_mut()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{internal_type_class, is_ruby_class};

    #[test]
    fn one_handle_per_name_released_with_its_last_holder() {
        let mut classes = NamedClasses::default();
        let a = classes.acquire("Foo");
        let b = classes.acquire("Foo");
        let c = classes.acquire("Bar");
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(is_named_class(a) && !is_ruby_class(a));
        assert_eq!(classes.name(a), Some("Foo"));
        classes.release(a);
        assert_eq!(classes.name(a), Some("Foo"));
        classes.release(b);
        assert_eq!(classes.name(a), None);
        assert_eq!(classes.len(), 1);
        // Ruby classes and internal-type tags are not named handles.
        classes.release(ClassRef(0x1000));
        classes.release(internal_type_class(5, false));
        assert_eq!(classes.len(), 1);
        assert!(is_ruby_class(ClassRef(0x1000)) && !is_named_class(ClassRef(0x1000)));
    }
}
