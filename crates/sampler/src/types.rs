//! The handles the sampler stores for Ruby things it never looks inside,
//! and every tag bit they carry, in one place. The binding layer makes
//! them from VALUEs; the sampler only compares, hashes and tags them.
//!
//! | handle        | even (low bit 0)          | odd                                   |
//! |---------------|---------------------------|---------------------------------------|
//! | `FrameRef`    | a frame VALUE (0: cut off) | a frame held by name (`3, 5, 7, ...`) |
//! | `ClassRef`    | a class VALUE (0: none)    | low 3 bits `001` internal VM type, `101` hidden object's type, `011` class held by name; the type or name index above them |

/// Address of a sampled Ruby object (its VALUE). Never dereferenced here;
/// a type of its own so that no other number (a sample id, an object id, a
/// size) can be passed for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(transparent)]
pub struct ObjectAddress(pub usize);

impl ObjectAddress {
    /// No object (0 is Ruby's `false`, never an object's address): a
    /// record whose object was freed.
    pub const NONE: ObjectAddress = ObjectAddress(0);
}

/// A frame: the VALUE that `rb_profile_frames` returned (a method entry
/// or iseq, even), or a frame held by name since a flush named it (odd).
/// A type of its own, so that a class handle is never taken for one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct FrameRef(pub u64);

/// Stands for the frames cut off when a stack is deeper than the capture
/// limit. 0 is never a frame handle (it is Ruby's `false`).
pub const TRUNCATION_FRAME: FrameRef = FrameRef(0);

/// A frame held by name (see `StackTable::detach_frames`). Odd handles
/// start at 3, so 1 (an older profile builder's placeholder) never is one.
pub fn is_resolved_frame(frame: FrameRef) -> bool {
    frame.0 & 1 == 1 && frame.0 > 1
}

/// The handle of the `index`-th frame held by name.
pub fn resolved_frame(index: u32) -> FrameRef {
    FrameRef(((u64::from(index) + 1) << 1) | 1)
}

/// The index of a frame held by name (`is_resolved_frame(frame)`).
pub fn resolved_frame_index(frame: FrameRef) -> usize {
    ((frame.0 >> 1) - 1) as usize
}

/// A sample's class: a Ruby class (an even address, marked by the binding
/// layer), an internal VM type, or a class held by name (see the table
/// above). A type of its own, so that a frame handle is never taken for
/// one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct ClassRef(pub u64);

const CLASS_TAG_BITS: u32 = 3;
const CLASS_TAG_MASK: u64 = (1 << CLASS_TAG_BITS) - 1;
/// An object without a usable class (T_NODE, T_IMEMO...): its VM type.
const INTERNAL_TYPE_TAG: u64 = 0b001;
/// A hidden object (klass 0, e.g. a frozen string literal's buffer).
const HIDDEN_TYPE_TAG: u64 = 0b101;
/// A class held by name (see `named_classes`).
const NAMED_CLASS_TAG: u64 = 0b011;

/// True for a handle of a Ruby class object (what must be kept alive).
pub fn is_ruby_class(class: ClassRef) -> bool {
    class.0 != 0 && class.0 & 1 == 0
}

/// True for a class held by name.
pub fn is_named_class(class: ClassRef) -> bool {
    class.0 & CLASS_TAG_MASK == NAMED_CLASS_TAG
}

/// The handle of the `index`-th class held by name.
pub fn named_class(index: u32) -> ClassRef {
    ClassRef((u64::from(index) << CLASS_TAG_BITS) | NAMED_CLASS_TAG)
}

/// The index of a class held by name (`is_named_class(class)`).
pub fn named_class_index(class: ClassRef) -> usize {
    (class.0 >> CLASS_TAG_BITS) as usize
}

/// The handle for an object of VM type `kind` that has no usable class:
/// `hidden` when it has none at all (klass 0).
pub fn internal_type_class(kind: u64, hidden: bool) -> ClassRef {
    let tag = if hidden {
        HIDDEN_TYPE_TAG
    } else {
        INTERNAL_TYPE_TAG
    };
    ClassRef((kind << CLASS_TAG_BITS) | tag)
}

/// The VM type and hiddenness of an `internal_type_class` handle.
pub fn internal_type_of(class: ClassRef) -> Option<(u64, bool)> {
    match class.0 & CLASS_TAG_MASK {
        INTERNAL_TYPE_TAG => Some((class.0 >> CLASS_TAG_BITS, false)),
        HIDDEN_TYPE_TAG => Some((class.0 >> CLASS_TAG_BITS, true)),
        _ => None,
    }
}

// Tests write handles as the integers they wrap.
#[cfg(test)]
impl PartialEq<u64> for FrameRef {
    fn eq(&self, other: &u64) -> bool {
        self.0 == *other
    }
}

#[cfg(test)]
impl PartialEq<u64> for ClassRef {
    fn eq(&self, other: &u64) -> bool {
        self.0 == *other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_handle_kind_is_told_apart() {
        let ruby_class = ClassRef(0x7f00_1000);
        let named = named_class(5);
        let internal = internal_type_class(0x1a, false);
        let hidden = internal_type_class(0x05, true);
        assert!(is_ruby_class(ruby_class) && !is_named_class(ruby_class));
        assert!(is_named_class(named) && !is_ruby_class(named));
        assert_eq!(named_class_index(named), 5);
        assert_eq!(internal_type_of(internal), Some((0x1a, false)));
        assert_eq!(internal_type_of(hidden), Some((0x05, true)));
        assert_eq!(internal_type_of(named), None);
        assert_eq!(internal_type_of(ruby_class), None);
        assert!(!is_ruby_class(ClassRef(0)) && !is_ruby_class(internal) && !is_ruby_class(hidden));
    }

    #[test]
    fn resolved_frames_are_odd_from_three_up() {
        assert_eq!(resolved_frame(0), FrameRef(3));
        assert_eq!(resolved_frame_index(resolved_frame(41)), 41);
        assert!(is_resolved_frame(FrameRef(3)) && !is_resolved_frame(FrameRef(1)));
        assert!(!is_resolved_frame(TRUNCATION_FRAME) && !is_resolved_frame(FrameRef(0x7f00_1000)));
    }
}
