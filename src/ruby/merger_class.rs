//! `MemprofilerPprof::Profile::Merger`'s native half: an
//! analysis::merge::Merger wrapped as TypedData, fed one Profile at a time
//! (lib/memprofiler_pprof_rs/readers/profile.rb). It holds no Ruby
//! objects. Adding runs without the GVL, so the merger sits behind a
//! mutex: two threads adding to one merger take turns.

use std::ffi::CStr;
use std::sync::{Mutex, TryLockError};

use rb_sys::{rb_ary_push, rb_ull2inum, Qfalse, Qnil, Qtrue, VALUE};

use super::errors::{method_entry, protect, RbError, RbResult};
use super::gvl::without_gvl;
use super::method_table::{method_def, MethodDef, MethodKind};
use super::profile_class::{memory_refusal, profile_of, wrap};
use super::typed_data::{self, DataType, TypedData};
use analysis::decoded_profile::ViewError;
use analysis::merge::Merger;
use analysis::read_budget::READ_BUDGET;

/// The merger, until `finish` takes it.
type Wrapped = Mutex<Option<Merger>>;

impl TypedData for Wrapped {
    const NAME: &'static CStr = c"MemprofilerPprof::Profile::Merger";
    const NOUN: &'static str = "merger";
    // Dropping it frees Rust memory only.
    const FREE_IMMEDIATELY: bool = true;
    const HOLDS_OBJECTS: bool = false;

    fn memory_bytes(&self) -> usize {
        // (Busy in another thread: its last size is not known; say 0.)
        self.try_lock().ok().map_or(0, |merger| {
            merger.as_ref().map_or(0, |m| m.memory_bytes() as usize)
        })
    }

    fn release(wrapped: Box<Self>) {
        // Locked while nothing can be using it: a forked child's copy of a
        // merger a thread of the parent was changing. Its tables may be
        // half-changed, so it is leaked rather than dropped.
        let busy = matches!(wrapped.try_lock(), Err(TryLockError::WouldBlock));
        if busy {
            std::mem::forget(wrapped);
        }
    }
}

static MERGER_TYPE: DataType<Wrapped> = DataType::of();

/// Ruby's allocator for the class: an empty merger held to the read budget.
pub unsafe extern "C" fn merger_alloc(klass: VALUE) -> VALUE {
    method_entry(|| {
        typed_data::wrap(
            klass,
            Mutex::new(Some(Merger::within(&READ_BUDGET))),
            &MERGER_TYPE,
        )
    })
}

fn merger_of(object: VALUE) -> RbResult<&'static Wrapped> {
    typed_data::get(object, &MERGER_TYPE)
}

/// Runs `work` on the merger without the GVL; None when it has finished.
fn with_merger<T: Send>(
    rb_self: VALUE,
    work: impl FnOnce(&mut Option<Merger>) -> T + Send,
) -> RbResult<T> {
    let wrapped = merger_of(rb_self)?;
    without_gvl(|| {
        // (Poisoned: an earlier call panicked midway; its state is unknown.)
        wrapped.lock().map(|mut merger| work(&mut merger)).ok()
    })?
    .ok_or_else(|| RbError::state("this merger failed earlier; start a new one"))
}

fn finished() -> RbError {
    RbError::state("this merger has finished; start a new one")
}

/// `#_native_add(profile)` → nil, or `[reason]` when the read budget
/// refused it (nothing was added then).
unsafe extern "C" fn native_add(rb_self: VALUE, profile: VALUE) -> VALUE {
    method_entry(|| {
        // (`profile`, on this method's stack, keeps it alive.)
        let profile = profile_of(profile)?;
        let added = with_merger(rb_self, |merger| {
            merger.as_mut().map(|merger| merger.add_within(profile))
        })?
        .ok_or_else(finished)?;
        match added {
            Ok(()) => Ok(Qnil as VALUE),
            Err(ViewError::Argument(message)) => Err(RbError::argument(message)),
            Err(ViewError::Memory(message)) => memory_refusal(&message),
        }
    })
}

/// `#_native_finish(profile_class)` → the merged Profile, or
/// `[reason, kept]` when the read budget refused it (`kept`: refused before
/// the merger was used up, so a retry may succeed).
unsafe extern "C" fn native_finish(rb_self: VALUE, profile_class: VALUE) -> VALUE {
    method_entry(|| {
        let merged = with_merger(rb_self, |merger| {
            let m = merger.as_mut()?;
            if m.is_empty() {
                return Some(Err((
                    ViewError::Argument("merge needs at least one profile".to_string()),
                    true,
                )));
            }
            if let Err(refused) = m.reserve_finish() {
                return Some(Err((refused, true)));
            }
            merger
                .take()
                .map(|m| m.finish_within().map_err(|e| (e, false)))
        })?
        .ok_or_else(finished)?;
        match merged {
            Ok(profile) => wrap(profile_class, profile),
            Err((ViewError::Argument(message), _)) => Err(RbError::argument(message)),
            Err((ViewError::Memory(message), kept)) => memory_refusal_kept(&message, kept),
        }
    })
}

fn memory_refusal_kept(message: &str, kept: bool) -> RbResult<VALUE> {
    let refusal = memory_refusal(message)?;
    let kept = if kept { Qtrue } else { Qfalse } as VALUE;
    // SAFETY: `refusal` is the Array just made (on this stack); under protect.
    protect(|| unsafe { rb_ary_push(refusal, kept) })
}

/// `#_native_size` → profiles added so far.
unsafe extern "C" fn native_size(rb_self: VALUE) -> VALUE {
    method_entry(|| {
        let added = with_merger(rb_self, |merger| merger.as_ref().map(Merger::len))?
            .ok_or_else(finished)?;
        // SAFETY: plain Integer allocation under protect.
        protect(|| unsafe { rb_ull2inum(added as u64) })
    })
}

pub fn methods() -> Vec<MethodDef> {
    vec![
        method_def!(c"_native_add", native_add, 1, MethodKind::Private),
        method_def!(c"_native_finish", native_finish, 1, MethodKind::Private),
        method_def!(c"_native_size", native_size, 0, MethodKind::Private),
    ]
}
