//! The native methods of a class, as a table Init walks: name, C function,
//! arity and whether the method is public, private or a singleton method.

use std::ffi::{c_int, CStr};

use rb_sys::{rb_define_method, rb_define_private_method, rb_define_singleton_method, VALUE};

/// A Ruby method's C entry point, type-erased as rb_define_method wants.
pub type AnyMethod = unsafe extern "C" fn() -> VALUE;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MethodKind {
    Public,
    Private,
    /// A method of the class itself (`Profile.parse`), not of instances.
    Singleton,
}

pub struct MethodDef {
    pub name: &'static CStr,
    pub func: AnyMethod,
    pub arity: c_int,
    pub kind: MethodKind,
}

/// `method_def!(c"name", function, arity, MethodKind::Private)`.
macro_rules! method_def {
    ($name:literal, $func:expr, $arity:literal, $kind:expr) => {
        $crate::ruby::method_table::MethodDef {
            name: $name,
            // SAFETY: Ruby calls the function with `arity` VALUE arguments
            // plus self, which is exactly its real signature.
            func: unsafe {
                std::mem::transmute::<*const (), $crate::ruby::method_table::AnyMethod>(
                    $func as *const (),
                )
            },
            arity: $arity,
            kind: $kind,
        }
    };
}
pub(crate) use method_def;

/// Defines every method of `methods` on `class`.
///
/// # Safety
/// Must run with the GVL held, under `protect` (defining can raise), with
/// `class` a live class.
pub unsafe fn define_methods(class: VALUE, methods: &[MethodDef]) {
    for method in methods {
        let define = match method.kind {
            MethodKind::Public => rb_define_method,
            MethodKind::Private => rb_define_private_method,
            MethodKind::Singleton => rb_define_singleton_method,
        };
        // SAFETY: the caller's contract; name is a static C string and func
        // has the arity given with it.
        unsafe { define(class, method.name.as_ptr(), Some(method.func), method.arity) };
    }
}
