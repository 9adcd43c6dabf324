//! A Rust value owned by a Ruby object (TypedData): the data type Ruby
//! calls back through, handing the value to Ruby, and finding it again.
//! The classes (`collector_class`, `profile_class`, `merger_class`) each
//! implement `TypedData` for what they wrap and keep one `DataType<T>` in a
//! `static` (not a `const`: each use of a const may be a copy at another
//! address), whose address is the type's identity.
//!
//! When these run: `wrap` and `get` with the GVL held, outside GC. The
//! callbacks are Ruby's: `dmark` and `dcompact` during GC (no allocation,
//! no Ruby call), `dfree` during or after GC (immediately only for a type
//! that says it can be), `dsize` from `ObjectSpace.memsize_of`. None of them
//! lets a panic out.

use std::ffi::{c_void, CStr};
use std::marker::PhantomData;
use std::panic::{catch_unwind, AssertUnwindSafe};

use rb_sys::{
    rb_data_type_struct, rb_data_type_struct__bindgen_ty_1, rb_data_type_t,
    rb_data_typed_object_wrap, ruby_value_type, RB_TYPE_P, RTYPEDDATA_GET_DATA, RTYPEDDATA_P,
    RTYPEDDATA_TYPE, VALUE,
};

use super::errors::{protect, RbError, RbResult};

/// What a wrapped value tells Ruby about itself.
pub trait TypedData: Sized + 'static {
    /// The class's name, for Ruby's data type and for type errors.
    const NAME: &'static CStr;
    /// What the value is called in "... is not initialized".
    const NOUN: &'static str;
    /// Whether Ruby may free it during GC (RUBY_TYPED_FREE_IMMEDIATELY):
    /// only if dropping it does nothing a GC forbids.
    const FREE_IMMEDIATELY: bool;
    /// Whether it holds Ruby objects: only then are `mark` and
    /// `update_references` Ruby's dmark and dcompact. No default, so that an
    /// impl cannot write a `mark` that is never called.
    const HOLDS_OBJECTS: bool;

    /// Heap bytes it owns (`ObjectSpace.memsize_of`).
    fn memory_bytes(&self) -> usize;

    /// Marks the Ruby objects it keeps (during GC: no allocation). Called
    /// only when `HOLDS_OBJECTS`.
    fn mark(&self) {}

    /// Follows the objects compaction moved (during GC: no allocation).
    /// Called only when `HOLDS_OBJECTS`.
    fn update_references(&self) {}

    /// Ruby is done with the value; dropping it is the default.
    fn release(value: Box<Self>) {
        drop(value);
    }
}

/// A class's data type, kept in a static: Ruby keeps pointers to it. Typed
/// by what it wraps, so that `wrap` and `get` cannot pair a value with
/// another class's data type.
pub struct DataType<T>(rb_data_type_t, PhantomData<fn() -> T>);

// SAFETY: immutable after initialisation; its pointers point at static
// data (the name and the callbacks). No T is stored.
unsafe impl<T> Sync for DataType<T> {}

impl<T: TypedData> DataType<T> {
    pub const fn of() -> DataType<T> {
        // SAFETY: all-zero is a valid rb_data_type_t (null pointers, no
        // callbacks); the fields used are set below.
        let mut functions: rb_data_type_struct__bindgen_ty_1 = unsafe { std::mem::zeroed() };
        if T::HOLDS_OBJECTS {
            functions.dmark = Some(mark::<T>);
            functions.dcompact = Some(compact::<T>);
        }
        functions.dfree = Some(free::<T>);
        functions.dsize = Some(size::<T>);
        // SAFETY: as above.
        let mut data_type: rb_data_type_struct = unsafe { std::mem::zeroed() };
        data_type.wrap_struct_name = T::NAME.as_ptr();
        data_type.function = functions;
        // RUBY_TYPED_FREE_IMMEDIATELY is 1.
        data_type.flags = if T::FREE_IMMEDIATELY { 1 } else { 0 };
        DataType(data_type, PhantomData)
    }
}

// Ruby calls dmark, dcompact and dsize only for an object whose data is
// set; only dfree can see a null pointer (an allocation that failed).
unsafe extern "C" fn mark<T: TypedData>(data: *mut c_void) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: Ruby passes the pointer `wrap` gave it, alive until dfree.
        unsafe { &*(data as *const T) }.mark();
    }));
}

unsafe extern "C" fn compact<T: TypedData>(data: *mut c_void) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: as in `mark`.
        unsafe { &*(data as *const T) }.update_references();
    }));
}

unsafe extern "C" fn free<T: TypedData>(data: *mut c_void) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        if !data.is_null() {
            // SAFETY: the Box `wrap` leaked, freed exactly once, here.
            T::release(unsafe { Box::from_raw(data as *mut T) });
        }
    }));
}

unsafe extern "C" fn size<T: TypedData>(data: *const c_void) -> rb_sys::size_t {
    catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: as in `mark`.
        unsafe { &*(data as *const T) }.memory_bytes() as rb_sys::size_t
    }))
    .unwrap_or(0)
}

/// Hands `value` to Ruby as an instance of `klass`, typed `data_type`.
pub fn wrap<T: TypedData>(
    klass: VALUE,
    value: T,
    data_type: &'static DataType<T>,
) -> RbResult<VALUE> {
    let pointer = Box::into_raw(Box::new(value));
    let wrapped = protect(|| {
        // SAFETY: `pointer` is a valid heap pointer; Ruby owns it from here
        // and frees it through `free::<T>`.
        unsafe { rb_data_typed_object_wrap(klass, pointer.cast(), &data_type.0) }
    });
    if wrapped.is_err() {
        // SAFETY: Ruby did not take ownership; we still own the Box.
        drop(unsafe { Box::from_raw(pointer) });
    }
    wrapped
}

/// The value `object` wraps, if it is of `data_type` (a TypeError
/// otherwise, for any VALUE: immediates, other objects, other data).
pub fn get<T: TypedData>(object: VALUE, data_type: &'static DataType<T>) -> RbResult<&'static T> {
    // SAFETY: RB_TYPE_P handles immediates (nil, Integers) and reads only
    // the flags of heap objects; the typed-data header is read only once
    // the object is known to be T_DATA, and its type compared before the
    // data is used. The data was set by `wrap` and lives as long as the
    // object, which the caller keeps alive (self, or an argument).
    unsafe {
        if !RB_TYPE_P(object, ruby_value_type::RUBY_T_DATA)
            || !RTYPEDDATA_P(object)
            || !std::ptr::eq(RTYPEDDATA_TYPE(object), &data_type.0)
        {
            let name = T::NAME.to_string_lossy();
            return Err(RbError::type_error(format!("expected a {name}")));
        }
        let data = RTYPEDDATA_GET_DATA(object) as *const T;
        if data.is_null() {
            return Err(RbError::state(format!("{} is not initialized", T::NOUN)));
        }
        Ok(&*data)
    }
}
