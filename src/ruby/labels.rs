//! The process's label sets and the current fiber's: what
//! `MemprofilerPprof.with_labels` sets and the NEWOBJ hook reads.
//!
//! The current set is an Integer id in a fiber-local variable
//! (`Thread.current[FIBER_KEY]`), so it follows the fiber a request or job
//! runs on. The hook reads it with `rb_thread_local_aref`, a lookup in the
//! current fiber's table that neither allocates nor calls Ruby, and only
//! when it takes a sample and some set was ever interned.

use std::ffi::c_long;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex, MutexGuard};

use rb_sys::{
    rb_ary_new_capa, rb_ary_push, rb_id2sym, rb_intern, rb_obj_freeze, rb_thread_current,
    rb_thread_local_aref, rb_utf8_str_new, Qnil, ID, VALUE,
};

use super::convert::{array_elements, count_arg, fixnum, rust_string, shown};
use super::errors::{protect, RbError, RbResult};
use super::method_table::{method_def, MethodDef, MethodKind};
use sampler::label_sets::{LabelNames, LabelSetId, LabelSets, NO_LABELS};

/// The fiber-local variable holding the current set's id.
const FIBER_KEY: &std::ffi::CStr = c"__memprofiler_pprof_rs_labels";

static SETS: LazyLock<Mutex<LabelSets>> = LazyLock::new(|| Mutex::new(LabelSets::default()));
/// FIBER_KEY's ID, once Init has interned it.
static FIBER_KEY_ID: AtomicU64 = AtomicU64::new(0);
/// Whether any set was ever interned: until then the hook reads nothing.
static IN_USE: AtomicBool = AtomicBool::new(false);

fn sets() -> MutexGuard<'static, LabelSets> {
    // Never taken in a hook or by GC; a panic while held leaves the table
    // whole (interning checks everything before it changes anything).
    SETS.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Interns the fiber key. Called from Init, with the GVL.
pub fn init() {
    // SAFETY: a static C string; Init holds the GVL.
    let id = unsafe { rb_intern(FIBER_KEY.as_ptr()) };
    FIBER_KEY_ID.store(id as u64, Ordering::Relaxed);
}

/// The label set current on this fiber. For the NEWOBJ hook: allocates
/// nothing, calls no Ruby method, takes no lock.
pub fn current() -> LabelSetId {
    if !IN_USE.load(Ordering::Relaxed) {
        return NO_LABELS;
    }
    let key = FIBER_KEY_ID.load(Ordering::Relaxed) as ID;
    // SAFETY: called on a Ruby thread with the GVL (the hook's caller);
    // rb_thread_current returns the running thread's object and
    // rb_thread_local_aref looks `key` up in its current fiber's table,
    // neither allocating nor raising (3.1 to master: thread.c).
    let value = unsafe { rb_thread_local_aref(rb_thread_current(), key) };
    // Anything but an id we gave out (the app could store something else
    // under the key) is no labels; an unknown id is named by nothing.
    match fixnum(value).and_then(|n| u32::try_from(n).ok()) {
        Some(id) => LabelSetId(id),
        None => NO_LABELS,
    }
}

/// The sets as they are now, for a flush to name its samples' ids.
pub fn names() -> LabelNames {
    sets().snapshot()
}

/// Sets folded into "(other)" since the process started.
pub fn folds() -> u64 {
    sets().folds()
}

fn ruby_string(text: &str) -> RbResult<VALUE> {
    // SAFETY: text's pointer and length describe valid UTF-8; allocates
    // under protect.
    protect(|| unsafe {
        rb_obj_freeze(rb_utf8_str_new(text.as_ptr().cast(), text.len() as c_long))
    })
}

/// `Labels._intern([[key, value], ...])`: the id of that set. Keys and
/// values must be UTF-8 (or ASCII, or binary: invalid bytes read as
/// U+FFFD) Strings; the Ruby side converts the rest. Reads them with no
/// Ruby allocation in between: the pairs are copied out of `pairs` into a
/// Vec the GC does not see, and an allocation could run a compacting GC
/// that moves them.
unsafe extern "C" fn native_intern(_module: VALUE, pairs: VALUE) -> VALUE {
    super::errors::method_entry(|| {
        let mut labels = Vec::new();
        for pair in array_elements(pairs, "labels")? {
            let items = array_elements(pair, "a label")?;
            let [key, value] = items[..] else {
                return Err(RbError::argument(format!(
                    "a label must be a [key, value] pair, got {}",
                    shown(pair)
                )));
            };
            let (Some(key), Some(value)) = (rust_string(key), rust_string(value)) else {
                return Err(RbError::type_error(format!(
                    "a label's key and value must be Strings, got {}",
                    shown(pair)
                )));
            };
            labels.push((key, value));
        }
        let id = sets()
            .intern(&labels)
            .map_err(|error| RbError::argument(error.to_string()))?;
        if id != NO_LABELS {
            IN_USE.store(true, Ordering::Relaxed);
        }
        integer(u64::from(id.0))
    })
}

fn integer(n: u64) -> RbResult<VALUE> {
    // SAFETY: allocates at most a Bignum; under protect.
    protect(|| unsafe { rb_sys::rb_ull2inum(n) })
}

/// `Labels._labels(id)`: the set's [key, value] pairs, or nil.
unsafe extern "C" fn native_labels(_module: VALUE, id: VALUE) -> VALUE {
    super::errors::method_entry(|| {
        let Some(id) = fixnum(id).and_then(|n| u32::try_from(n).ok()) else {
            return Ok(Qnil as VALUE);
        };
        let Some(labels) = sets().get(LabelSetId(id)).cloned() else {
            return Ok(Qnil as VALUE);
        };
        // SAFETY: allocates an Array under protect.
        let array = protect(|| unsafe { rb_ary_new_capa(labels.len() as c_long) })?;
        for (key, value) in labels.iter() {
            let key = ruby_string(key)?;
            let value = ruby_string(value)?;
            protect(|| {
                // SAFETY: `array` is the Array made above, reachable from
                // this frame (conservative stack scan) like key and value.
                unsafe {
                    let pair = rb_ary_new_capa(2);
                    rb_ary_push(pair, key);
                    rb_ary_push(pair, value);
                    rb_ary_push(array, pair)
                }
            })?;
        }
        Ok(array)
    })
}

unsafe extern "C" fn native_max_sets(_module: VALUE) -> VALUE {
    super::errors::method_entry(|| integer(sets().max_sets() as u64))
}

unsafe extern "C" fn native_set_max_sets(_module: VALUE, max: VALUE) -> VALUE {
    super::errors::method_entry(|| {
        let max = count_arg(max, "max_label_sets")?;
        sets()
            .set_max_sets(max)
            .map_err(|error| RbError::argument(error.to_string()))?;
        integer(max as u64)
    })
}

unsafe extern "C" fn native_folds(_module: VALUE) -> VALUE {
    super::errors::method_entry(|| {
        let folds = folds();
        integer(folds)
    })
}

unsafe extern "C" fn native_count(_module: VALUE) -> VALUE {
    super::errors::method_entry(|| integer(sets().len() as u64))
}

/// `Labels::FIBER_KEY`, so the Ruby side stores ids where the hook reads.
pub fn fiber_key_symbol() -> VALUE {
    // SAFETY: the ID was interned by `init`; rb_id2sym of an existing ID
    // returns its static Symbol.
    unsafe { rb_id2sym(FIBER_KEY_ID.load(Ordering::Relaxed) as ID) }
}

pub fn methods() -> Vec<MethodDef> {
    vec![
        method_def!(c"_intern", native_intern, 1, MethodKind::Singleton),
        method_def!(c"_labels", native_labels, 1, MethodKind::Singleton),
        method_def!(c"max_sets", native_max_sets, 0, MethodKind::Singleton),
        method_def!(
            c"_set_max_sets",
            native_set_max_sets,
            1,
            MethodKind::Singleton
        ),
        method_def!(c"folds", native_folds, 0, MethodKind::Singleton),
        method_def!(c"count", native_count, 0, MethodKind::Singleton),
    ]
}
