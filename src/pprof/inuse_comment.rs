//! The profile comment that says what inuse_* counts (sampler/state/
//! flush.rs, `InuseCutoff`), written at a flush and read back by `diff`:
//!
//! ```text
//! inuse_*: sampled objects alive at the last completed GC (GC 1234); 57 sampled since are left out until a GC has run since their allocation (alloc_* counts them)
//! ```
//!
//! Two profiles that name the same GC hold the same in-use: nothing was
//! freed or counted in between.

use crate::sampler::state::InuseCutoff;

const AT_GC: &str = "inuse_*: sampled objects alive at the last completed GC (GC ";
const NO_GC: &str = "inuse_*: no GC has completed yet, so no sampled object is known to be alive;";

pub fn format_inuse_comment(cutoff: InuseCutoff, too_young: usize) -> String {
    if cutoff.min_age == 0 {
        return "inuse_*: sampled objects not freed at the flush, garbage not collected yet \
                included (inuse_as_of: :flush)"
            .into();
    }
    let last = cutoff.gc_count.wrapping_sub(cutoff.min_age - 1);
    let left_out = format!(
        "{too_young} sampled since are left out until a GC has run since their allocation \
         (alloc_* counts them)"
    );
    if last == 0 {
        format!("{NO_GC} {left_out}")
    } else {
        format!("{AT_GC}{last}); {left_out}")
    }
}

/// The GC a profile's in-use is as of (0: none had completed), if its
/// comments say.
pub fn last_completed_gc<'a>(comments: impl IntoIterator<Item = &'a str>) -> Option<u32> {
    comments.into_iter().find_map(|comment| {
        if comment.starts_with(NO_GC) {
            return Some(0);
        }
        let rest = comment.strip_prefix(AT_GC)?;
        rest[..rest.find(')')?].parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gc_is_read_back() {
        let done = format_inuse_comment(InuseCutoff::last_completed_gc(1234, false), 57);
        assert_eq!(
            done,
            "inuse_*: sampled objects alive at the last completed GC (GC 1234); 57 sampled since \
             are left out until a GC has run since their allocation (alloc_* counts them)"
        );
        assert_eq!(last_completed_gc(["other", done.as_str()]), Some(1234));
        let under_way = format_inuse_comment(InuseCutoff::last_completed_gc(1234, true), 0);
        assert_eq!(last_completed_gc([under_way.as_str()]), Some(1233));
        let none = format_inuse_comment(InuseCutoff::last_completed_gc(0, false), 3);
        assert_eq!(last_completed_gc([none.as_str()]), Some(0));
        let at_flush = format_inuse_comment(InuseCutoff::at_flush(9), 0);
        assert_eq!(last_completed_gc([at_flush.as_str()]), None);
        assert_eq!(
            last_completed_gc(["inuse_*: sampled objects alive at the last completed GC (GC x)"]),
            None
        );
    }
}
