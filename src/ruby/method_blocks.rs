//! Where a method's blocks are (sampler::block_frames says why frames need
//! it): read at flush through `MemprofilerPprof::MethodBlocks.describe`
//! (lib/memprofiler_pprof_rs/method_blocks.rb), which finds the method's
//! instruction sequences again by its class and name, and cached per
//! method for the life of the process, so a method is described once.

use std::sync::{Arc, Mutex};

use rb_sys::{
    rb_funcallv, rb_intern, rb_path2class, rb_profile_frame_base_label, rb_profile_frame_classpath,
    rb_profile_frame_label, rb_profile_frame_method_name, rb_profile_frame_singleton_method_p,
    NIL_P, VALUE,
};

use super::convert::{array_elements, fixnum, is_array, rust_string};
use super::errors::{protect, RbError, RbResult};
use sampler::block_frames::{BlockCode, BlockKind, MethodBlocks};
use sampler::fast_hash::FastHashMap;

/// A method by its qualified name, file and first line.
type MethodKey = (String, String, i64);

/// Methods described so far, with or without blocks. Taken only at flush,
/// never from a hook, and never across a Ruby call.
static DESCRIBED: Mutex<Option<FastHashMap<MethodKey, Option<Arc<MethodBlocks>>>>> =
    Mutex::new(None);
/// Past this many methods the cache starts again (an app that generates
/// code without end must not grow it without end); ~200 bytes each.
const DESCRIBED_LIMIT: usize = 10_000;
/// More blocks than this in one method: described as none (the Ruby side
/// stops at 1,000 too).
const MAX_BLOCKS: usize = 1_000;

fn cached(key: &MethodKey) -> Option<Option<Arc<MethodBlocks>>> {
    let described = DESCRIBED.lock().ok()?;
    described.as_ref()?.get(key).cloned()
}

fn remember(key: MethodKey, blocks: Option<Arc<MethodBlocks>>) {
    if let Ok(mut described) = DESCRIBED.lock() {
        let map = described.get_or_insert_with(FastHashMap::default);
        if map.len() >= DESCRIBED_LIMIT {
            map.clear();
        }
        map.insert(key, blocks);
    }
}

/// Reads the blocks of the methods of one flush's frames.
#[derive(Default)]
pub struct MethodBlocksReader {
    /// `MemprofilerPprof::MethodBlocks`, once looked up (Some(None): not
    /// loaded, e.g. only the extension was required).
    helper: Option<Option<VALUE>>,
}

impl MethodBlocksReader {
    /// The blocks of the method whose frame `frame` is (`name`, `file`,
    /// `path` and `first_lineno` already read from it), or None: a frame
    /// that is not a method's (a top-level block, a class body), a method
    /// without blocks, or one that cannot be found by name.
    pub fn read(
        &mut self,
        frame: VALUE,
        name: &str,
        file: &str,
        path: VALUE,
        first_lineno: VALUE,
    ) -> RbResult<Option<Arc<MethodBlocks>>> {
        // The cache first: every flush names the frames of the stacks taken
        // since the previous one, mostly the same methods again.
        let key = (
            name.to_string(),
            file.to_string(),
            fixnum(first_lineno).unwrap_or(0),
        );
        if let Some(blocks) = cached(&key) {
            return Ok(blocks);
        }
        let blocks = if is_method_frame(frame)? {
            self.describe(frame, name, path, first_lineno)?
                .map(Arc::new)
        } else {
            None
        };
        remember(key, blocks.clone());
        Ok(blocks)
    }

    fn helper(&mut self) -> RbResult<Option<VALUE>> {
        if let Some(helper) = self.helper {
            return Ok(helper);
        }
        // SAFETY: a static C string; raises (caught) if the constant is missing.
        let helper = match protect(|| unsafe {
            rb_path2class(c"MemprofilerPprof::MethodBlocks".as_ptr())
        }) {
            Ok(module) => Some(module),
            Err(RbError::Exception(_)) => None,
            Err(other) => return Err(other),
        };
        self.helper = Some(helper);
        Ok(helper)
    }

    fn describe(
        &mut self,
        frame: VALUE,
        name: &str,
        path: VALUE,
        first_lineno: VALUE,
    ) -> RbResult<Option<MethodBlocks>> {
        let Some(helper) = self.helper()? else {
            return Ok(None);
        };
        // SAFETY (all three): `frame` is a live frame (the caller's
        // contract); each call reads it and may allocate, under protect.
        let class_path = protect(|| unsafe { rb_profile_frame_classpath(frame) })?;
        let method_name = protect(|| unsafe { rb_profile_frame_method_name(frame) })?;
        let singleton = protect(|| unsafe { rb_profile_frame_singleton_method_p(frame) })?;
        let args = [class_path, method_name, singleton, path, first_lineno];
        // SAFETY: `helper` is the module found above; `args` holds 5 VALUEs
        // (on this stack, so the GC sees them) for the 5 the method takes.
        let described = protect(|| unsafe {
            rb_funcallv(
                helper,
                rb_intern(c"describe".as_ptr()),
                args.len() as _,
                args.as_ptr(),
            )
        });
        // It rescues StandardError and ScriptError itself; what gets through
        // (Interrupt, a Timeout or Thread#raise, SystemExit) is the program's
        // and goes on up, uncached.
        blocks_from(described?, name)
    }
}

/// Whether `frame` is a method's own frame, the only kind that can be
/// running one of its blocks: a method (its label is its base label), not
/// a block, class body or script.
fn is_method_frame(frame: VALUE) -> RbResult<bool> {
    // SAFETY (all three): `frame` is a live frame; these return Strings
    // held by its instruction sequence (or nil), under protect.
    let method_name = protect(|| unsafe { rb_profile_frame_method_name(frame) })?;
    if NIL_P(method_name) {
        return Ok(false);
    }
    let label = protect(|| unsafe { rb_profile_frame_label(frame) })?;
    let base_label = protect(|| unsafe { rb_profile_frame_base_label(frame) })?;
    Ok(rust_string(label).is_some() && rust_string(label) == rust_string(base_label))
}

/// `MethodBlocks.describe`'s answer as core data; None for nil or anything
/// not shaped as documented there. Calls nothing that allocates: the answer
/// and its elements, read into a Rust Vec the GC does not scan, must stay
/// alive until the end, and only an allocation could free them.
fn blocks_from(description: VALUE, method: &str) -> RbResult<Option<MethodBlocks>> {
    if !is_array(description) {
        return Ok(None);
    }
    let entries = array_elements(description, "blocks")?;
    if entries.len() > MAX_BLOCKS {
        return Ok(None);
    }
    let mut blocks = Vec::with_capacity(entries.len());
    for entry in entries {
        if !is_array(entry) {
            return Ok(None);
        }
        let [prefix, start, end, parent, kind] = array_elements(entry, "block")?[..] else {
            return Ok(None);
        };
        // The prefix ("block in ", "rescue in "...) is ASCII in whatever
        // encoding the source had: read as is, with no conversion.
        let (Some(prefix), Some(start_line), Some(end_line)) =
            (rust_string(prefix), fixnum(start), fixnum(end))
        else {
            return Ok(None);
        };
        let parent = match (NIL_P(parent), fixnum(parent)) {
            (true, _) => None,
            (false, Some(index)) => match usize::try_from(index) {
                Ok(index) => Some(index),
                Err(_) => return Ok(None),
            },
            (false, None) => return Ok(None),
        };
        let kind = match rust_string(kind).as_deref() {
            Some("block") => BlockKind::Block,
            Some("rescue") => BlockKind::Rescue,
            Some("ensure") => BlockKind::Ensure,
            _ => return Ok(None),
        };
        blocks.push(BlockCode {
            name: format!("{prefix}{method}"),
            start_line,
            end_line,
            parent,
            kind,
        });
    }
    Ok(MethodBlocks::new(blocks))
}
