//! The native methods of a class, as a table Init walks: name, C function,
//! arity and whether the method is public, private or a singleton method.

use std::ffi::{c_int, CStr};

use rb_sys::{rb_define_method, rb_define_private_method, rb_define_singleton_method, VALUE};

/// A Ruby method's C entry point, type-erased as rb_define_method wants.
pub type AnyMethod = unsafe extern "C" fn() -> VALUE;

/// One argument of a method's signature, in `method_def!`.
pub type V = VALUE;

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

/// `method_def!(c"name", function, arity, MethodKind::Private)`, for the
/// arities the classes use (a new one needs its line here).
///
/// `function` must be an `extern "C"` function of `arity` VALUEs plus self,
/// returning a VALUE: the macro coerces it to exactly that pointer type
/// before erasing it, so a wrong arity or signature is a compile error.
macro_rules! method_def {
    ($name:literal, $func:expr, 0, $kind:expr) => {
        $crate::ruby::method_table::method_def!(@typed $name, $func, 0, $kind, (V))
    };
    ($name:literal, $func:expr, 1, $kind:expr) => {
        $crate::ruby::method_table::method_def!(@typed $name, $func, 1, $kind, (V, V))
    };
    ($name:literal, $func:expr, 2, $kind:expr) => {
        $crate::ruby::method_table::method_def!(@typed $name, $func, 2, $kind, (V, V, V))
    };
    ($name:literal, $func:expr, 3, $kind:expr) => {
        $crate::ruby::method_table::method_def!(@typed $name, $func, 3, $kind, (V, V, V, V))
    };
    ($name:literal, $func:expr, 4, $kind:expr) => {
        $crate::ruby::method_table::method_def!(@typed $name, $func, 4, $kind, (V, V, V, V, V))
    };
    ($name:literal, $func:expr, 5, $kind:expr) => {
        $crate::ruby::method_table::method_def!(@typed $name, $func, 5, $kind, (V, V, V, V, V, V))
    };
    ($name:literal, $func:expr, 6, $kind:expr) => {
        $crate::ruby::method_table::method_def!(@typed $name, $func, 6, $kind, (V, V, V, V, V, V, V))
    };
    ($name:literal, $func:expr, 8, $kind:expr) => {
        $crate::ruby::method_table::method_def!(@typed $name, $func, 8, $kind, (V, V, V, V, V, V, V, V, V))
    };
    (@typed $name:literal, $func:expr, $arity:literal, $kind:expr, ($($v:ident),+)) => {{
        // The arity is the signature's: self and one VALUE per argument.
        const _: () = assert!([$(stringify!($v)),+].len() == $arity + 1);
        type Signature = unsafe extern "C" fn($($crate::ruby::method_table::$v),+) -> ::rb_sys::VALUE;
        // The coercion is the check: it fails to compile unless `$func`
        // takes exactly self and `$arity` VALUEs and returns a VALUE.
        let typed: Signature = $func;
        $crate::ruby::method_table::MethodDef {
            name: $name,
            // SAFETY: only the pointer's type is erased; Ruby calls it with
            // self and `$arity` VALUEs, which the coercion above proved is
            // its real signature.
            func: unsafe { std::mem::transmute::<Signature, $crate::ruby::method_table::AnyMethod>(typed) },
            arity: $arity,
            kind: $kind,
        }
    }};
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
