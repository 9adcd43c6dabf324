//! The profile comment that says what inuse_* counts (sampler/state/
//! flush.rs, `InuseCutoff`), written at a flush and read back by `diff`:
//!
//! ```text
//! inuse_*: sampled objects alive at the last completed GC (GC 1234); 57 sampled since are left out until a GC has run since their allocation (alloc_* counts them)
//! inuse_*: sampled objects alive at the last completed GC (GC 1233; GC 1234 under way); ...
//! ```
//!
//! Two profiles of one process that name the same GC, with none under way,
//! hold the same in-use: nothing was freed or counted in between. (While a
//! GC sweeps, the objects it frees leave the in-use of the GC before.)

use sampler::state::InuseCutoff;

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
    let under_way = if cutoff.min_age > 1 {
        format!("; GC {} under way", cutoff.gc_count)
    } else {
        String::new()
    };
    if last == 0 {
        format!("{NO_GC} {left_out}")
    } else {
        format!("{AT_GC}{last}{under_way}); {left_out}")
    }
}

/// The GC a profile's in-use is as of (0: none had completed), if its
/// comments say so once, with no GC under way at the flush; None for
/// anything else (a merge of several processes' profiles names several).
pub fn settled_gc<'a>(comments: impl IntoIterator<Item = &'a str>) -> Option<u32> {
    let mut found = None;
    for comment in comments {
        let gc = if comment.starts_with(NO_GC) {
            0
        } else if let Some(rest) = comment.strip_prefix(AT_GC) {
            let number = &rest[..rest.find(')')?];
            // "1233; GC 1234 under way": frees were still coming.
            number.parse().ok()?
        } else {
            continue;
        };
        if found.replace(gc).is_some() {
            return None;
        }
    }
    found
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
        assert_eq!(settled_gc(["other", done.as_str()]), Some(1234));
        let under_way = format_inuse_comment(InuseCutoff::last_completed_gc(1234, true), 0);
        assert!(
            under_way.contains("(GC 1233; GC 1234 under way)"),
            "{under_way}"
        );
        assert_eq!(settled_gc([under_way.as_str()]), None);
        let none = format_inuse_comment(InuseCutoff::last_completed_gc(0, false), 3);
        assert_eq!(settled_gc([none.as_str()]), Some(0));
        let at_flush = format_inuse_comment(InuseCutoff::at_flush(9), 0);
        assert_eq!(settled_gc([at_flush.as_str()]), None);
        let garbled = "inuse_*: sampled objects alive at the last completed GC (GC x)";
        assert_eq!(settled_gc([garbled]), None);
        // A merge of two processes' profiles: no one GC.
        let other = format_inuse_comment(InuseCutoff::last_completed_gc(99, false), 0);
        assert_eq!(settled_gc([done.as_str(), other.as_str()]), None);
    }
}
