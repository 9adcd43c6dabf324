//! The same two-argument method bound twice: through magnus's `method!`
//! (`add`, whose `&self` is type-checked), and by hand (`raw_add`: an
//! `extern "C"` function, arguments converted by hand, panics caught, no
//! check of self; the gem's methods add a type check of a few
//! instructions and `method_entry`'s error mapping).
//! bench/magnus_probe.rb counts the instructions of a call of each.
use std::panic::{catch_unwind, AssertUnwindSafe};

use magnus::{function, method, prelude::*, rb_sys::AsRawValue, Error, Ruby};
use rb_sys::{rb_define_method, rb_int2inum, rb_num2long, Qnil, VALUE};

#[magnus::wrap(class = "Probe", free_immediately, size)]
struct Probe;

impl Probe {
    fn new() -> Self {
        Probe
    }
    fn add(&self, a: i64, b: i64) -> i64 {
        a + b
    }
}

unsafe extern "C" fn raw_add(_rb_self: VALUE, a: VALUE, b: VALUE) -> VALUE {
    let sum = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the probe passes Integers only (rb_num2long would raise otherwise).
        unsafe { rb_num2long(a) + rb_num2long(b) }
    }));
    match sum {
        // SAFETY: makes a Fixnum.
        Ok(sum) => unsafe { rb_int2inum(sum as _) },
        Err(_) => Qnil as VALUE,
    }
}

#[magnus::init]
fn init(ruby: &Ruby) -> Result<(), Error> {
    let class = ruby.define_class("Probe", ruby.class_object())?;
    class.define_singleton_method("new", function!(Probe::new, 0))?;
    class.define_method("add", method!(Probe::add, 2))?;
    let raw: unsafe extern "C" fn(VALUE, VALUE, VALUE) -> VALUE = raw_add;
    // SAFETY: Ruby calls it with self and 2 arguments, its real signature.
    unsafe {
        rb_define_method(
            class.as_raw(),
            c"raw_add".as_ptr(),
            Some(std::mem::transmute::<
                unsafe extern "C" fn(VALUE, VALUE, VALUE) -> VALUE,
                unsafe extern "C" fn() -> VALUE,
            >(raw)),
            2,
        )
    };
    Ok(())
}
