//! Ruby backtraces: captured in the allocation hook as raw frame VALUEs (no
//! Ruby object allocated), turned into names only at flush time.

use std::ffi::c_int;
use std::sync::Arc;
use std::time::Duration;

use rb_sys::{
    rb_profile_frame_first_lineno, rb_profile_frame_full_label, rb_profile_frame_path,
    rb_profile_frames, VALUE,
};

use super::convert::{fixnum, utf8_string};
use super::errors::{protect, RbResult};
use super::gvl::GvlHolds;
use super::method_blocks::MethodBlocksReader;
use pprof::heap_profile::FrameInfo;
use sampler::fast_hash::FastHashMap;
use sampler::stack_table::{Frame, StackId};
use sampler::types::{is_resolved_frame, FrameRef, TRUNCATION_FRAME};

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

    /// The current thread's Ruby backtrace, leaf first. `top_line` is
    /// asked for the line of the innermost frame when rb_profile_frames
    /// gives 0 for it.
    ///
    /// # Safety
    /// Must run on a Ruby thread holding the GVL (e.g. inside a NEWOBJ hook).
    pub unsafe fn capture(&mut self, top_line: impl FnOnce() -> c_int) -> &[Frame] {
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
        if depth > 0 && self.lines[0] == 0 {
            // Ruby 3.3 and 3.4 report line 0 for the top frame whenever JIT
            // code (YJIT) pushed it (`cfp == top && cfp->jit_return` in
            // vm_backtrace.c; 4.0 reads the pc instead), though YJIT saves
            // the pc before anything that allocates. `top_line` reads that
            // pc, as ObjectSpace's allocation tracing does. For a C method on
            // top (line 0 by design) it gives the caller's line, which the
            // profile shows for C methods anyway.
            self.lines[0] = top_line();
        }
        let depth = usize::try_from(depth).unwrap_or(0);
        self.frames.clear();
        for i in 0..depth.min(MAX_FRAMES) {
            self.frames.push(Frame {
                frame: FrameRef(self.values[i]),
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

/// Names, files and first lines of every Ruby frame in `stacks` (resolved
/// frames already have theirs), and where the blocks of their methods are.
/// Calls into Ruby (which allocates), so it must run without the sampler
/// lock held; the frames stay alive because the stack table still holds
/// (and marks) them. With `yield_after`, lets other threads run whenever the
/// GVL has been held that long.
pub fn resolve_frames(
    stacks: &FastHashMap<StackId, Arc<[Frame]>>,
    yield_after: Option<Duration>,
    holds: &mut GvlHolds,
) -> RbResult<FastHashMap<FrameRef, FrameInfo>> {
    let mut resolved: FastHashMap<FrameRef, FrameInfo> = FastHashMap::default();
    let mut blocks = MethodBlocksReader::default();
    for frames in stacks.values() {
        // (Per stack too: once the frames are named, a million stacks
        // still take a while to look through.)
        if let Some(long) = yield_after {
            holds.yield_if_held(long)?;
        }
        for frame in frames.iter() {
            if frame.frame == TRUNCATION_FRAME
                || is_resolved_frame(frame.frame)
                || resolved.contains_key(&frame.frame)
            {
                continue;
            }
            if let Some(long) = yield_after {
                holds.yield_if_held(long)?;
            }
            let info = frame_info(frame.frame.0 as VALUE, &mut blocks)?;
            resolved.insert(frame.frame, info);
        }
    }
    Ok(resolved)
}

/// One frame's name, file and first line. `value` is a frame from
/// rb_profile_frames, kept alive by the collector's mark function.
fn frame_info(value: VALUE, blocks: &mut MethodBlocksReader) -> RbResult<FrameInfo> {
    // SAFETY (label and path): `value` is a live frame (above); these read
    // it, allocating the result, under protect.
    let label = protect(|| unsafe { rb_profile_frame_full_label(value) })?;
    let name = utf8_string(label)?.unwrap_or_else(|| "(unknown)".to_string());
    let path = protect(|| unsafe { rb_profile_frame_path(value) })?;
    let filename = utf8_string(path)?;
    if filename
        .as_deref()
        .is_some_and(|f| f.starts_with("<internal:"))
    {
        // Ruby's own methods written in Ruby (Integer#times since 3.3, at
        // <internal:numeric>): shown as C methods are, at their caller's
        // file and line, as Ruby 4.0's backtraces show them and as the same
        // methods read on Rubies where they are C. The file would only point
        // inside Ruby itself.
        return Ok(FrameInfo {
            name,
            filename: None,
            start_line: 0,
            blocks: None,
        });
    }
    // SAFETY: as above.
    let first_lineno = protect(|| unsafe { rb_profile_frame_first_lineno(value) })?;
    let start_line = fixnum(first_lineno).unwrap_or(0);
    let blocks = match &filename {
        Some(file) => blocks.read(value, &name, file, path, first_lineno)?,
        None => None,
    };
    Ok(FrameInfo {
        name,
        filename,
        start_line,
        blocks,
    })
}
