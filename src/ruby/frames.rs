//! Ruby backtraces: captured in the allocation hook as raw frame VALUEs (no
//! Ruby object allocated), turned into names only at flush time.

use std::ffi::c_int;
use std::sync::Arc;

use rb_sys::{
    rb_ascii8bit_encindex, rb_enc_get, rb_enc_get_index, rb_profile_frame_first_lineno,
    rb_profile_frame_full_label, rb_profile_frame_path, rb_profile_frames, rb_str_conv_enc,
    rb_usascii_encindex, rb_utf8_encindex, rb_utf8_encoding, ruby_value_type, FIX2LONG, FIXNUM_P,
    NIL_P, RB_TYPE_P, RSTRING_LEN, RSTRING_PTR, VALUE,
};

use super::errors::{protect, RbResult};
use crate::core::fast_hash::FastHashMap;
use crate::core::profile_builder::FrameInfo;
use crate::core::stack_table::{is_resolved_frame, Frame, FrameRef, StackId, TRUNCATION_FRAME};

/// Deepest stack kept; deeper ones end in a "(truncated stack)" frame.
pub const MAX_FRAMES: usize = 1024;

/// Preallocated buffers for one capture, reused under the sampler lock so
/// the hook does no allocation of its own in the common case.
pub struct BacktraceBuffer {
    values: Vec<VALUE>,
    lines: Vec<c_int>,
    frames: Vec<Frame>,
}

impl Default for BacktraceBuffer {
    fn default() -> Self {
        BacktraceBuffer {
            values: vec![0; MAX_FRAMES + 1],
            lines: vec![0; MAX_FRAMES + 1],
            frames: Vec::with_capacity(MAX_FRAMES + 1),
        }
    }
}

impl BacktraceBuffer {
    pub fn memory_bytes() -> usize {
        (MAX_FRAMES + 1) * (std::mem::size_of::<VALUE>() + std::mem::size_of::<c_int>())
            + (MAX_FRAMES + 1) * std::mem::size_of::<Frame>()
    }

    /// The current thread's Ruby backtrace, leaf first.
    ///
    /// # Safety
    /// Must run on a Ruby thread holding the GVL (e.g. inside a NEWOBJ hook).
    pub unsafe fn capture(&mut self) -> &[Frame] {
        // One slot more than kept, to tell a stack of exactly MAX_FRAMES from
        // a deeper one.
        // SAFETY: both buffers hold MAX_FRAMES + 1 elements, the limit passed;
        // rb_profile_frames only reads the VM stack and allocates nothing.
        let depth = unsafe {
            rb_profile_frames(
                0,
                (MAX_FRAMES + 1) as c_int,
                self.values.as_mut_ptr(),
                self.lines.as_mut_ptr(),
            )
        };
        let depth = usize::try_from(depth).unwrap_or(0);
        self.frames.clear();
        for i in 0..depth.min(MAX_FRAMES) {
            self.frames.push(Frame {
                frame: self.values[i] as FrameRef,
                line: self.lines[i],
            });
        }
        if depth > MAX_FRAMES {
            self.frames.push(Frame {
                frame: TRUNCATION_FRAME,
                line: 0,
            });
        }
        &self.frames
    }
}

/// Copies a Ruby String's bytes into a Rust String, replacing invalid UTF-8
/// (method names and paths can be arbitrary bytes).
pub fn rust_string(value: VALUE) -> Option<String> {
    // SAFETY: RB_TYPE_P only reads the object's flags; `value` came from a
    // Ruby API call that returns a String or nil.
    if NIL_P(value) || !unsafe { RB_TYPE_P(value, ruby_value_type::RUBY_T_STRING) } {
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
    // SAFETY: RB_TYPE_P reads the flags only; for a String the encoding
    // index is read from its header (no allocation, no raise).
    let is_string = !NIL_P(value) && unsafe { RB_TYPE_P(value, ruby_value_type::RUBY_T_STRING) };
    if !is_string {
        return Ok(None);
    }
    // SAFETY: `value` is a String (checked above).
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

/// Names, files and first lines of every Ruby frame in `stacks` (resolved
/// frames already have theirs). Calls into Ruby
/// (which allocates), so it must run without the sampler lock held; the
/// frames stay alive because the stack table still holds (and marks) them.
/// With `yield_every`, lets other threads run after that many frames.
pub fn resolve_frames(
    stacks: &FastHashMap<StackId, Arc<[Frame]>>,
    yield_every: Option<usize>,
) -> RbResult<FastHashMap<FrameRef, FrameInfo>> {
    let mut resolved: FastHashMap<FrameRef, FrameInfo> = FastHashMap::default();
    for frames in stacks.values() {
        for frame in frames.iter() {
            if frame.frame == TRUNCATION_FRAME
                || is_resolved_frame(frame.frame)
                || resolved.contains_key(&frame.frame)
            {
                continue;
            }
            if let Some(every) = yield_every {
                if !resolved.is_empty() && resolved.len() % every == 0 {
                    super::collector::yield_to_other_threads()?;
                }
            }
            let value = frame.frame as VALUE;
            // SAFETY (all three): `value` is a frame from rb_profile_frames,
            // kept alive by the collector's mark function.
            let label = protect(|| unsafe { rb_profile_frame_full_label(value) })?;
            let name = utf8_string(label)?.unwrap_or_else(|| "(unknown)".to_string());
            let path = protect(|| unsafe { rb_profile_frame_path(value) })?;
            let filename = utf8_string(path)?;
            let first_line = protect(|| unsafe { rb_profile_frame_first_lineno(value) })?;
            let start_line = if FIXNUM_P(first_line) {
                // SAFETY: checked to be a Fixnum.
                (unsafe { FIX2LONG(first_line) }) as i64
            } else {
                0
            };
            resolved.insert(
                frame.frame,
                FrameInfo {
                    name,
                    filename,
                    start_line,
                },
            );
        }
    }
    Ok(resolved)
}
