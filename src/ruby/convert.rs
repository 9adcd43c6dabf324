//! Conversions between Ruby values and Rust data, in one place: reading
//! Strings and Arrays without calling Ruby, and names as UTF-8.

use std::ffi::c_long;

use rb_sys::{
    rb_ary_entry, rb_ascii8bit_encindex, rb_enc_get, rb_enc_get_index, rb_inspect, rb_str_conv_enc,
    rb_usascii_encindex, rb_utf8_encindex, rb_utf8_encoding, ruby_value_type, FIX2LONG, FIXNUM_P,
    NIL_P, RARRAY_LEN, RB_TYPE_P, RSTRING_LEN, RSTRING_PTR, VALUE,
};

use super::errors::{protect, RbError, RbResult};
use sampler::types::ObjectAddress;

/// The bits of an object's flags word that give its type (`RUBY_T_MASK`),
/// read straight from the header in the hooks, where no Ruby call is allowed.
const T_MASK: VALUE = 0x1f;

/// The type bits of an object's flags word (`flags & RUBY_T_MASK`).
pub fn builtin_type(flags: VALUE) -> VALUE {
    flags & T_MASK
}

pub fn is_string(value: VALUE) -> bool {
    // SAFETY: reads the object's flags only.
    !NIL_P(value) && unsafe { RB_TYPE_P(value, ruby_value_type::RUBY_T_STRING) }
}

pub fn is_array(value: VALUE) -> bool {
    // SAFETY: reads the object's flags only.
    !NIL_P(value) && unsafe { RB_TYPE_P(value, ruby_value_type::RUBY_T_ARRAY) }
}

/// The elements of a Ruby Array (read without calling Ruby).
pub fn array_elements(array: VALUE, name: &str) -> RbResult<Vec<VALUE>> {
    if !is_array(array) {
        return Err(RbError::type_error(format!("{name} must be an Array")));
    }
    // SAFETY: `array` is an Array; rb_ary_entry reads an element without
    // allocating or raising (out-of-range reads give nil).
    let length = unsafe { RARRAY_LEN(array) };
    Ok((0..length)
        // SAFETY: as above; `i` is below the length just read, and nothing
        // in between can run Ruby code that would shrink the Array.
        .map(|i| unsafe { rb_ary_entry(array, i as c_long) })
        .collect())
}

/// Copies a Ruby String's bytes into a Rust String, replacing invalid UTF-8
/// (method names and paths can be arbitrary bytes).
pub fn rust_string(value: VALUE) -> Option<String> {
    if !is_string(value) {
        return None;
    }
    // SAFETY: `value` is a String; its pointer and length describe its bytes,
    // which stay put while we copy them (no Ruby call in between).
    let bytes = unsafe {
        std::slice::from_raw_parts(RSTRING_PTR(value).cast::<u8>(), RSTRING_LEN(value) as usize)
    };
    Some(String::from_utf8_lossy(bytes).into_owned())
}

/// A name or path as UTF-8, for the profile: a String in another encoding
/// (a class or method named in ISO-8859-1 or Shift_JIS source) is converted
/// from it first; bytes that are still not UTF-8 (binary names, invalid
/// sequences) become U+FFFD. Calls into Ruby (allocates), so only at flush.
pub fn utf8_string(value: VALUE) -> RbResult<Option<String>> {
    if !is_string(value) {
        return Ok(None);
    }
    // SAFETY: `value` is a String (checked above); its encoding index is
    // read from its header (no allocation, no raise).
    let index = unsafe { rb_enc_get_index(value) };
    // SAFETY: these read Ruby's fixed encoding table indexes.
    let plain = unsafe {
        [
            rb_utf8_encindex(),
            rb_usascii_encindex(),
            rb_ascii8bit_encindex(),
        ]
    };
    if plain.contains(&index) {
        return Ok(rust_string(value));
    }
    // SAFETY: `value` is a String; rb_str_conv_enc allocates the converted
    // copy (under protect) and returns `value` itself when it cannot convert.
    let converted =
        protect(|| unsafe { rb_str_conv_enc(value, rb_enc_get(value), rb_utf8_encoding()) })?;
    Ok(rust_string(converted))
}

/// A Fixnum's value; None for anything else (nil, a Bignum, another type).
pub fn fixnum(value: VALUE) -> Option<i64> {
    // SAFETY: FIX2LONG only after FIXNUM_P, which tests the tag bits.
    FIXNUM_P(value).then(|| unsafe { FIX2LONG(value) } as i64)
}

/// A count, by the gem's argument rule (lib/memprofiler_pprof_rs/validation.rb):
/// not an Integer is a TypeError; an Integer the collector cannot take
/// (negative, or beyond the Fixnum range) is an ArgumentError. Both name the
/// value.
pub fn count_arg(value: VALUE, name: &str) -> RbResult<usize> {
    let expected = format!("{name} must be an Integer from 0 to {}", c_long::MAX >> 1);
    if !FIXNUM_P(value) {
        // SAFETY: reads the object's flags only (a Fixnum was ruled out above;
        // NIL_P rules out the other immediate RB_TYPE_P is asked about).
        let bignum = !NIL_P(value) && unsafe { RB_TYPE_P(value, ruby_value_type::RUBY_T_BIGNUM) };
        let message = format!("{expected}, got {}", shown(value));
        return Err(if bignum {
            RbError::argument(message)
        } else {
            RbError::type_error(message)
        });
    }
    // SAFETY: checked to be a Fixnum.
    let n = unsafe { FIX2LONG(value) };
    usize::try_from(n).map_err(|_| RbError::argument(format!("{expected}, got {n}")))
}

/// `value.inspect` for a message (at most 200 characters), or its kind if
/// inspect fails.
pub fn shown(value: VALUE) -> String {
    // SAFETY: the GVL is held (a method entry); rb_inspect may raise, which
    // protect catches.
    let text = protect(|| unsafe { rb_inspect(value) })
        .ok()
        .and_then(rust_string)
        .unwrap_or_else(|| "an object whose #inspect failed".to_owned());
    match text.char_indices().nth(200) {
        Some((end, _)) => format!("{}...", &text[..end]),
        None => text,
    }
}

/// The sampler's handle for the object `value` (its address).
pub fn object_address(value: VALUE) -> ObjectAddress {
    ObjectAddress(value as usize)
}

/// The VALUE at a sampled object's address (the caller knows whether an
/// object still lives there).
pub fn object_value(address: ObjectAddress) -> VALUE {
    address.0 as VALUE
}
