//! Questions about Ruby heap objects that must be asked carefully: is this
//! address still a live object, and how big is it.
//!
//! `rb_obj_memsize_of`, `rb_objspace_markable_object_p` and
//! `rb_objspace_garbage_object_p` are exported by libruby but not declared
//! in its public headers, and their presence changes between Ruby versions
//! (Ruby 3.4 removed the markable one), so they are looked up at load time
//! with dlsym. Without `rb_obj_memsize_of` sizes are reported as 0; without
//! either liveness check, objects are only checked by their type bits, which
//! would take an object that died but is not swept yet (Ruby sweeps lazily)
//! for a live one.

use std::ffi::{c_int, c_void, CStr};
use std::sync::OnceLock;

use rb_sys::{
    rb_gc_count, rb_gc_disable, rb_gc_enable, rb_gc_latest_gc_info, rb_gc_stat, rb_id2sym,
    rb_intern, rb_obj_id, ruby_fl_type, ruby_value_type, Qnil, Qtrue, VALUE,
};

use super::convert::{builtin_type, object_value};
use super::errors::{protect, RbResult};
use sampler::fast_hash::FastHashMap;
use sampler::types::ObjectAddress;

type MemsizeOf = unsafe extern "C" fn(VALUE) -> usize;
type ObjectPredicate = unsafe extern "C" fn(VALUE) -> c_int;

/// Whether an object in a heap slot is alive, as the GC sees it.
enum Liveness {
    /// `rb_objspace_markable_object_p` (Ruby 3.1-3.3): non-zero if alive.
    Markable(ObjectPredicate),
    /// `rb_objspace_garbage_object_p` (all Rubies; used from 3.4, which
    /// dropped the other): non-zero if dead (free, moved, a zombie, or
    /// unmarked on a page not swept yet).
    Garbage(ObjectPredicate),
}

struct HeapApi {
    memsize_of: Option<MemsizeOf>,
    liveness: Option<Liveness>,
}

static HEAP_API: OnceLock<HeapApi> = OnceLock::new();

fn lookup(name: &CStr) -> Option<*mut c_void> {
    // SAFETY: dlsym with RTLD_DEFAULT and a valid C string only reads the
    // process's symbol tables.
    let symbol = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    (!symbol.is_null()).then_some(symbol)
}

fn api() -> &'static HeapApi {
    // SAFETY (all three transmutes): these symbols, where present, have
    // these C signatures (size_t f(VALUE), int f(VALUE)) in every Ruby from
    // 2.x to 4.0 (gc.c, internal/gc.h).
    let predicate = |f| unsafe { std::mem::transmute::<*mut c_void, ObjectPredicate>(f) };
    HEAP_API.get_or_init(|| HeapApi {
        memsize_of: lookup(c"rb_obj_memsize_of")
            .map(|f| unsafe { std::mem::transmute::<*mut c_void, MemsizeOf>(f) }),
        liveness: lookup(c"rb_objspace_markable_object_p")
            .map(|f| Liveness::Markable(predicate(f)))
            .or_else(|| {
                lookup(c"rb_objspace_garbage_object_p").map(|f| Liveness::Garbage(predicate(f)))
            }),
    })
}

/// Resolves the symbols once, at extension load, off the allocation path.
pub fn init() {
    api();
    // Ruby makes the Symbols its GC.latest_gc_info and GC.stat answer with
    // on their first call (a dozen frozen Strings, and more, that live
    // forever): here, at load, not from a sampling collector's job, where
    // they were sampled and blamed on the app's code that was running.
    gc_is_marking();
    gc_count_and_under_way();
    allocation_counter();
}

pub fn can_measure_sizes() -> bool {
    api().memsize_of.is_some()
}

/// True if `object` is a live, fully formed heap object. Must be called with
/// the GVL held and not during GC.
///
/// Never inlined, so that valgrind reports (and script/valgrind.supp
/// names) its test of the liveness function's answer under this name.
/// While Ruby lazily sweeps, that answer is a bit of the GC's mark bitmap,
/// which memcheck believes undefined whenever Ruby's conservative stack
/// scan has marked an object through a stack word it never wrote (see the
/// suppression's comment).
#[inline(never)]
pub fn is_live_object(object: VALUE) -> bool {
    // SAFETY (both): `object` is the address of an object we saw allocated
    // and whose free we watch (the caller's contract), so it lies in a heap
    // page. (These functions read the flags word and page header right after
    // the special-constant test, without checking that the address is in the
    // heap, so any VALUE would not do.)
    let alive = match &api().liveness {
        Some(Liveness::Markable(markable)) => (unsafe { markable(object) }) != 0,
        Some(Liveness::Garbage(garbage)) => (unsafe { garbage(object) }) == 0,
        None => true,
    };
    if !alive {
        return false;
    }
    // SAFETY: `object` is a heap slot address (checked above where the
    // check is available; otherwise it is an address we saw allocated and
    // not freed); its first word is the flags word.
    let flags = unsafe { *(object as *const VALUE) };
    let kind = builtin_type(flags);
    kind != ruby_value_type::RUBY_T_NONE as VALUE
        && kind != ruby_value_type::RUBY_T_ZOMBIE as VALUE
        && kind != ruby_value_type::RUBY_T_MOVED as VALUE
}

/// The object's current size in bytes, or None if it is not a live object.
pub fn object_size(object: VALUE) -> Option<u64> {
    if !is_live_object(object) {
        return None;
    }
    if !memsize_of_is_safe(object) {
        return Some(0);
    }
    match api().memsize_of {
        // SAFETY: `object` is a live object (checked above) and the caller
        // holds the GVL outside GC, as rb_obj_memsize_of requires.
        Some(memsize_of) => Some(unsafe { memsize_of(object) } as u64),
        None => Some(0),
    }
}

/// Whether `rb_obj_memsize_of` may be asked about this live object. From
/// Ruby 4.0 on, not about classes, modules and their include wrappers: it
/// crashed processes there (dd-trace-rb's issue 5936), so those are sized 0
/// (docs/ruby-api.md).
fn memsize_of_is_safe(object: VALUE) -> bool {
    if !cfg!(ruby_gte_4_0) {
        return true;
    }
    // SAFETY: a live heap object (the caller checked): the flags word.
    let kind = builtin_type(unsafe { *(object as *const VALUE) });
    use ruby_value_type::*;
    ![RUBY_T_CLASS, RUBY_T_MODULE, RUBY_T_ICLASS]
        .iter()
        .any(|&t| t as VALUE == kind)
}

/// Types whose size `rb_obj_memsize_of` computes from the object's own
/// fields alone (no extension callbacks, no other objects): the only ones
/// measured from the FREEOBJ hook, where the object is intact but others
/// around it may already be swept.
fn measurable_at_free_kind(kind: VALUE) -> bool {
    use ruby_value_type::*;
    [
        RUBY_T_OBJECT,
        RUBY_T_STRING,
        RUBY_T_ARRAY,
        RUBY_T_HASH,
        RUBY_T_STRUCT,
        RUBY_T_FLOAT,
        RUBY_T_BIGNUM,
        RUBY_T_RATIONAL,
        RUBY_T_COMPLEX,
    ]
    .iter()
    .any(|&t| t as VALUE == kind)
}

/// Whether a sampled object can wait to be measured: if it is freed first,
/// `size_at_free` can still size it. Reads the flags word only.
pub fn measurable_at_free(object: VALUE) -> bool {
    // SAFETY: `object` is an object handed to a NEWOBJ hook (its RBasic
    // header is written); the first word is the flags.
    let flags = unsafe { *(object as *const VALUE) };
    measurable_at_free_kind(builtin_type(flags))
}

/// From the FREEOBJ hook, before the GC frees `object`: its size, for the
/// types `measurable_at_free` accepts; None for the others.
pub fn size_at_free(object: VALUE) -> Option<u64> {
    if !measurable_at_free(object) {
        return None;
    }
    // SAFETY: called from FREEOBJ, where the object is still intact, and
    // only for types whose size reads nothing but the object's own fields.
    api()
        .memsize_of
        .map(|memsize_of| unsafe { memsize_of(object) } as u64)
}

// ----- liveness through object ids (the collector's :light mode) -----------

extern "C" {
    // Exported by every Ruby from 2.x to 3.4 (gc.c), declared only in its
    // internal headers: calls `callback(start, end, stride, data)` once per
    // heap page region, after finishing any lazy sweep, with GC disabled.
    fn rb_objspace_each_objects(
        callback: unsafe extern "C" fn(*mut c_void, *mut c_void, usize, *mut c_void) -> c_int,
        data: *mut c_void,
    );
}

/// The heap's pages as they are now: where a slot may be read. Only valid
/// until Ruby next runs a GC (a page may be freed then), so take one right
/// before the checks it serves, with no Ruby allocation in between.
pub struct HeapPages {
    /// (start, end, stride) of each page region, sorted by start.
    regions: Vec<(usize, usize, usize)>,
}

unsafe extern "C" fn collect_region(
    start: *mut c_void,
    end: *mut c_void,
    stride: usize,
    data: *mut c_void,
) -> c_int {
    // SAFETY: `data` is the Vec passed by `HeapPages::now`, alive for the
    // whole rb_objspace_each_objects call. Pushing mallocs (Rust's
    // allocator, not Ruby's), which cannot start a GC.
    let regions = unsafe { &mut *data.cast::<Vec<(usize, usize, usize)>>() };
    if stride > 0 && (start as usize) < (end as usize) {
        regions.push((start as usize, end as usize, stride));
    }
    0
}

impl HeapPages {
    /// Lists the heap's pages (GVL held, not during GC). Finishes Ruby's
    /// lazy sweep first (rb_objspace_each_objects does), so every dead
    /// object is a free slot by then. O(pages): about 16,000 for a 1 GB heap.
    pub fn now() -> RbResult<Self> {
        let mut regions: Vec<(usize, usize, usize)> = Vec::new();
        let data = &mut regions as *mut Vec<(usize, usize, usize)>;
        protect(|| {
            // SAFETY: GVL held, outside GC; the callback only records the
            // regions into `regions`, which outlives the call.
            unsafe { rb_objspace_each_objects(collect_region, data.cast()) };
            Qnil as VALUE
        })?;
        regions.sort_unstable();
        Ok(HeapPages { regions })
    }

    /// True if `address` is the start of a slot of a heap page.
    pub fn is_slot(&self, address: usize) -> bool {
        let index = self
            .regions
            .partition_point(|&(start, _, _)| start <= address);
        let Some(&(start, end, stride)) = index.checked_sub(1).and_then(|i| self.regions.get(i))
        else {
            return false;
        };
        address < end && (address - start) % stride == 0
    }
}

/// The object id Ruby gives `object` (what `object_id` returns), as the raw
/// Fixnum VALUE. Marks the object FL_SEEN_OBJ_ID and enters it into Ruby's
/// id tables, which may allocate C memory (and so run a GC, or raise
/// NoMemoryError, hence `protect`): call it with the GVL, outside GC and
/// without holding the sampler lock.
pub fn object_id(object: VALUE) -> RbResult<u64> {
    // SAFETY: `object` is a live heap object (a pending sample, pinned by
    // the collector's mark); under protect, GVL held.
    protect(|| unsafe { rb_obj_id(object) })
}

/// True if the object at `address` is still the one Ruby gave `object_id`.
/// Ids are never reused, so a new object in a reused slot never passes.
/// Needs `pages` taken since the last GC. Starts no GC: it asks Ruby for
/// the id only of an object that already has one (a table lookup).
pub fn is_same_object(pages: &HeapPages, address: ObjectAddress, object_id: u64) -> bool {
    if !pages.is_slot(address.0) {
        return false;
    }
    let object = object_value(address);
    if !is_live_object(object) {
        return false;
    }
    // SAFETY: a heap slot holding a live object (checked above).
    let flags = unsafe { *(object as *const VALUE) };
    if flags & (ruby_fl_type::RUBY_FL_SEEN_OBJ_ID as VALUE) == 0 {
        return false;
    }
    // SAFETY: a live object that has an id: rb_obj_id only looks it up.
    (unsafe { rb_obj_id(object) }) as u64 == object_id
}

/// Where the objects with these ids are now (after GC.compact), by one
/// walk over the heap: a slot is asked for its id only if it has one
/// (FL_SEEN_OBJ_ID; a table lookup, no allocation). Ids not found belong
/// to objects that are gone. No Ruby method is called and nothing is
/// allocated in Ruby, so no GC can move anything in between (an earlier
/// version called ObjectSpace._id2ref, which raises for every dead id and
/// crashed Ruby 3.1 in the torture when run right after a compaction).
/// GVL held, outside GC. O(heap slots).
pub fn find_objects_by_id(ids: &FastHashMap<u64, usize>) -> RbResult<FastHashMap<usize, usize>> {
    struct Search<'a> {
        ids: &'a FastHashMap<u64, usize>,
        /// Caller's key (a sample) => the object's address.
        found: FastHashMap<usize, usize>,
    }
    unsafe extern "C" fn search_region(
        start: *mut c_void,
        end: *mut c_void,
        stride: usize,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: `data` is the Search below, alive for the whole walk.
        let search = unsafe { &mut *data.cast::<Search>() };
        if stride == 0 {
            return 0;
        }
        let mut slot = start as usize;
        while slot < end as usize {
            // SAFETY: a slot of a heap page Ruby hands us (its sweep
            // finished first): its first word is the flags word.
            let flags = unsafe { *(slot as *const VALUE) };
            let kind = builtin_type(flags);
            let live = kind != ruby_value_type::RUBY_T_NONE as VALUE
                && kind != ruby_value_type::RUBY_T_ZOMBIE as VALUE
                && kind != ruby_value_type::RUBY_T_MOVED as VALUE;
            if live && flags & (ruby_fl_type::RUBY_FL_SEEN_OBJ_ID as VALUE) != 0 {
                // SAFETY: a live object that has an id: a lookup only.
                let id = unsafe { rb_obj_id(slot as VALUE) };
                if let Some(&key) = search.ids.get(&id) {
                    search.found.insert(key, slot);
                }
            }
            slot += stride;
        }
        0
    }
    let mut search = Search {
        ids,
        found: FastHashMap::default(),
    };
    let data = &mut search as *mut Search;
    protect(|| {
        // SAFETY: GVL held, outside GC; the callback reads slots and
        // records into `search`, which outlives the call.
        unsafe { rb_objspace_each_objects(search_region, data.cast()) };
        Qnil as VALUE
    })?;
    Ok(search.found)
}

/// Whether this Ruby's GC.latest_gc_info knows :state (every default GC
/// from 3.1 does; another GC library might not, and an unknown key
/// raises), probed once at load under protect.
static HAS_GC_STATE: OnceLock<bool> = OnceLock::new();

/// GC.latest_gc_info(:state): :none, :marking or :sweeping (:none where
/// the GC does not say). GVL held; allocates nothing.
fn gc_state() -> VALUE {
    static KEY: OnceLock<VALUE> = OnceLock::new();
    static NONE: OnceLock<VALUE> = OnceLock::new();
    // SAFETY: interning a static name gives a static Symbol, never
    // collected, so caching the VALUE is fine; GVL held.
    let key = *KEY.get_or_init(|| unsafe { rb_id2sym(rb_intern(c"state".as_ptr())) });
    let known = *HAS_GC_STATE.get_or_init(|| {
        // SAFETY: a Symbol key makes rb_gc_latest_gc_info return that one
        // value or raise ArgumentError for a key it does not know: caught.
        protect(|| unsafe { rb_gc_latest_gc_info(key) }).is_ok()
    });
    if !known {
        return symbol(&NONE, c"none");
    }
    // SAFETY: as above; the key is known, so it does not raise.
    unsafe { rb_gc_latest_gc_info(key) }
}

/// A static Symbol, interned once.
fn symbol(cell: &'static OnceLock<VALUE>, name: &'static CStr) -> VALUE {
    // SAFETY: interning a static name gives a static Symbol, never
    // collected; GVL held.
    *cell.get_or_init(|| unsafe { rb_id2sym(rb_intern(name.as_ptr())) })
}

/// True while a GC is between its start and the end of its marking
/// (an incremental GC lets Ruby run between its marking steps). GVL held;
/// allocates nothing.
pub fn gc_is_marking() -> bool {
    static MARKING: OnceLock<VALUE> = OnceLock::new();
    gc_state() == symbol(&MARKING, c"marking")
}

/// Ruby's GC count and whether that GC is still under way (marking, or
/// sweeping lazily): read so that no GC can start in between. GVL held;
/// allocates nothing.
pub fn gc_count_and_under_way() -> (u32, bool) {
    static NONE: OnceLock<VALUE> = OnceLock::new();
    let none = symbol(&NONE, c"none");
    loop {
        // SAFETY: reads a counter; GVL held.
        let before = unsafe { rb_gc_count() } as u32;
        let under_way = gc_state() != none;
        // SAFETY: as above.
        if unsafe { rb_gc_count() } as u32 == before {
            return (before, under_way);
        }
    }
}

/// Ruby's count of objects allocated so far (GC.stat's
/// total_allocated_objects). GVL held, outside GC; allocates nothing.
pub fn allocation_counter() -> u64 {
    static KEY: OnceLock<VALUE> = OnceLock::new();
    // SAFETY: interning a static name gives a static Symbol, never
    // collected, so caching the VALUE is fine; GVL held.
    let key =
        *KEY.get_or_init(|| unsafe { rb_id2sym(rb_intern(c"total_allocated_objects".as_ptr())) });
    // SAFETY: a Symbol key makes rb_gc_stat return that one value, without
    // allocating.
    unsafe { rb_gc_stat(key) as u64 }
}

/// GC kept off until dropped, then left as it was. `rb_gc_disable` first
/// finishes a GC under way (its marking and its lazy sweep), so while this
/// lives nothing in the heap is garbage waiting to be swept, and no object
/// is freed or moved unless Ruby code calls GC.start or GC.compact.
pub struct GcOff {
    was_disabled: bool,
}

impl GcOff {
    pub fn now() -> GcOff {
        // SAFETY: a public GC control, GVL held, outside GC.
        let was_disabled = unsafe { rb_gc_disable() } == Qtrue as VALUE;
        GcOff { was_disabled }
    }
}

impl Drop for GcOff {
    fn drop(&mut self) {
        if !self.was_disabled {
            // SAFETY: as above.
            unsafe { rb_gc_enable() };
        }
    }
}
