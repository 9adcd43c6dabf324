//! Which class a sampled object belongs to: read in the allocation hook
//! without allocating (the object's RBasic header), named at flush time.

use rb_sys::{
    rb_class_name, rb_class_real, rb_class_superclass, rb_gc_count, ruby_value_type, RBasic, NIL_P,
    VALUE,
};

use super::convert::{builtin_type, utf8_string};
use super::errors::{protect, RbResult};
use sampler::fast_hash::FastHashMap;
use sampler::state::ObjectInfo;
use sampler::types::{internal_type_class, internal_type_of, is_ruby_class, ClassRef};

fn type_name(kind: u64) -> &'static str {
    use ruby_value_type::*;
    const NAMES: [(ruby_value_type, &str); 22] = [
        (RUBY_T_OBJECT, "T_OBJECT"),
        (RUBY_T_CLASS, "T_CLASS"),
        (RUBY_T_MODULE, "T_MODULE"),
        (RUBY_T_FLOAT, "T_FLOAT"),
        (RUBY_T_STRING, "T_STRING"),
        (RUBY_T_REGEXP, "T_REGEXP"),
        (RUBY_T_ARRAY, "T_ARRAY"),
        (RUBY_T_HASH, "T_HASH"),
        (RUBY_T_STRUCT, "T_STRUCT"),
        (RUBY_T_BIGNUM, "T_BIGNUM"),
        (RUBY_T_FILE, "T_FILE"),
        (RUBY_T_DATA, "T_DATA"),
        (RUBY_T_MATCH, "T_MATCH"),
        (RUBY_T_COMPLEX, "T_COMPLEX"),
        (RUBY_T_RATIONAL, "T_RATIONAL"),
        (RUBY_T_SYMBOL, "T_SYMBOL"),
        (RUBY_T_IMEMO, "T_IMEMO"),
        (RUBY_T_NODE, "T_NODE"),
        (RUBY_T_ICLASS, "T_ICLASS"),
        (RUBY_T_ZOMBIE, "T_ZOMBIE"),
        (RUBY_T_MOVED, "T_MOVED"),
        (RUBY_T_NONE, "T_NONE"),
    ];
    NAMES
        .iter()
        .find(|(t, _)| *t as u64 == kind)
        .map(|(_, name)| *name)
        .unwrap_or("T_UNKNOWN")
}

/// Types whose RBasic `klass` field holds the object's class. (For others,
/// e.g. T_IMEMO, that word holds other data.)
fn has_class(kind: u64) -> bool {
    use ruby_value_type::*;
    (RUBY_T_OBJECT as u64..=RUBY_T_RATIONAL as u64).contains(&kind) || kind == RUBY_T_SYMBOL as u64
}

/// What the NEWOBJ hook records about `object`. Reads two words of the
/// object's header and calls rb_gc_count; allocates nothing.
///
/// # Safety
/// `object` must be the object the NEWOBJ hook was called for.
pub unsafe fn object_info(object: VALUE) -> ObjectInfo {
    // SAFETY: a new object's RBasic header (flags, klass) is written before
    // the NEWOBJ hook runs.
    let (kind, klass) = unsafe { header(object) };
    let class = if !has_class(kind) {
        internal_type_class(kind, false)
    } else if klass == 0 {
        internal_type_class(kind, true)
    } else {
        ClassRef(klass)
    };
    // SAFETY: reads a counter; no allocation, no raise.
    ObjectInfo::new(class, unsafe { rb_gc_count() } as u32)
}

/// Whether Ruby code may be handed `object`: it has a class (not one of
/// Ruby's internal objects, such as an imemo, nor a hidden one, such as a
/// string's shared buffer).
///
/// # Safety
/// `object` must be a live object.
pub unsafe fn is_visible_object(object: VALUE) -> bool {
    // SAFETY: the caller's.
    let (kind, klass) = unsafe { header(object) };
    has_class(kind) && klass != 0
}

/// An object's type bits and its RBasic `klass` word (RBasic's layout is
/// the same in every Ruby).
///
/// # Safety
/// `object` must be an object whose header is written.
unsafe fn header(object: VALUE) -> (u64, VALUE) {
    // SAFETY: the caller's; reads two words.
    let (flags, klass) = unsafe {
        let basic = &*(object as *const RBasic);
        (basic.flags, basic.klass)
    };
    #[allow(clippy::unnecessary_cast)] // VALUE is 32 bits on 32-bit targets
    (builtin_type(flags) as u64, klass)
}

/// Class handles that are real class VALUEs (to be marked).
pub fn is_class_value(class: ClassRef) -> bool {
    is_ruby_class(class)
}

fn class_name(klass: VALUE) -> RbResult<Option<String>> {
    // SAFETY: `klass` is a live class; rb_class_name may allocate, so it
    // runs under protect.
    let name = protect(|| unsafe { rb_class_name(klass) })?;
    Ok(utf8_string(name)?.filter(|n| !n.starts_with("#<")))
}

/// The class's name; for an anonymous class (`Class.new(Foo)`), its nearest
/// named ancestor, so one label value stands for all such classes instead of
/// one per `#<Class:0x...>`.
fn class_label(klass: VALUE) -> RbResult<String> {
    if let Some(name) = class_name(klass)? {
        return Ok(name);
    }
    let mut ancestor = klass;
    for _ in 0..32 {
        let current = ancestor;
        // SAFETY: `current` is a live class; rb_class_superclass only reads
        // it, but raises for an uninitialized class, hence protect.
        ancestor = protect(|| unsafe { rb_class_superclass(current) })?;
        if NIL_P(ancestor) || ancestor == 0 {
            break;
        }
        if let Some(name) = class_name(ancestor)? {
            return Ok(format!("(anonymous subclass of {name})"));
        }
    }
    Ok("(anonymous class)".to_string())
}

/// Names for the classes of a flush (Ruby classes and internal types; the
/// core names classes it already holds by name). Calls into Ruby
/// (allocates), so it runs without the sampler lock; the classes are kept
/// alive (marked) by the collector until the flush finishes.
pub fn resolve_classes(classes: &[ClassRef]) -> RbResult<FastHashMap<ClassRef, String>> {
    let mut names = FastHashMap::default();
    for &class in classes {
        let name = if is_class_value(class) {
            let klass = class.0 as VALUE;
            // SAFETY: `klass` is a live class (marked); rb_class_real skips
            // singleton and include classes without allocating.
            let real = unsafe { rb_class_real(klass) };
            if real == 0 {
                "(anonymous class)".to_string()
            } else {
                class_label(real)?
            }
        } else {
            match internal_type_of(class) {
                Some((kind, true)) => format!("(hidden {})", type_name(kind)),
                Some((kind, false)) => format!("({})", type_name(kind)),
                None => "(unknown class)".to_string(),
            }
        };
        names.insert(class, name);
    }
    Ok(names)
}
