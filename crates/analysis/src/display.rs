//! Text from a profile as a report shows it, and the order rows are shown
//! in. A profile is input from anywhere: a name may hold terminal escape
//! sequences, or be 200 MB long. Reports show every name through `shown`,
//! and build labels only for the rows they print (`rank`).

use std::borrow::Cow;
use std::collections::BinaryHeap;

/// Names longer than this many characters are cut, with "…" (real ones
/// are well below it; a C++ template name can reach a few hundred).
pub const MAX_SHOWN_CHARS: usize = 500;

/// `text` safe and bounded for a terminal or a page: control characters
/// (ESC, BEL, CR, DEL, the C1 range...) become visible escapes such as
/// `\u{1b}`, and past `MAX_SHOWN_CHARS` characters it is cut with "…".
/// Borrows when there is nothing to change (the common case).
pub fn shown(text: &str) -> Cow<'_, str> {
    shown_at_most(text, MAX_SHOWN_CHARS)
}

/// `shown`, cut at `max_chars` characters.
pub fn shown_at_most(text: &str, max_chars: usize) -> Cow<'_, str> {
    let mut chars = 0usize;
    let mut clean = true;
    for c in text.chars() {
        chars += 1;
        if c.is_control() || chars > max_chars {
            clean = false;
            break;
        }
    }
    if clean {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len().min(max_chars * 4 + 8));
    for (count, c) in text.chars().enumerate() {
        if count == max_chars {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// The first `keep` rows (all if 0) in a report's order: by `number`,
/// biggest first, ties by label, smallest first. Labels cost time and
/// memory (a crafted profile can make millions of rows with long names,
/// all tied), so `label` is asked only for the rows above the last one
/// shown and for the rows tied with it, and of those tied rows only the
/// ones that make the cut are kept: memory is that of what is shown.
/// Returns each row with its label.
pub fn rank<R, N: Ord + Copy, L: Ord>(
    mut rows: Vec<R>,
    keep: usize,
    number: impl Fn(&R) -> N,
    mut label: impl FnMut(&R) -> L,
) -> Vec<(R, L)> {
    rows.sort_unstable_by_key(|row| std::cmp::Reverse(number(row)));
    let keep = if keep == 0 {
        rows.len()
    } else {
        keep.min(rows.len())
    };
    if keep == 0 {
        return Vec::new();
    }
    let boundary = number(&rows[keep - 1]);
    let above = rows[..keep]
        .iter()
        .take_while(|r| number(r) != boundary)
        .count();
    let tied_end = keep
        + rows[keep..]
            .iter()
            .take_while(|r| number(r) == boundary)
            .count();
    rows.truncate(tied_end);
    let tied = rows.split_off(above);
    let mut labelled: Vec<(R, L)> = rows
        .into_iter()
        .map(|row| {
            let text = label(&row);
            (row, text)
        })
        .collect();
    labelled.sort_by(|(a, a_label), (b, b_label)| {
        number(b).cmp(&number(a)).then_with(|| a_label.cmp(b_label))
    });
    // The tied rows' smallest labels, in a heap of `room` at most (its top
    // is the largest kept, dropped first).
    let room = keep - above;
    let mut smallest: BinaryHeap<ByLabel<R, L>> = BinaryHeap::with_capacity(room + 1);
    for row in tied {
        let text = label(&row);
        if smallest.len() == room {
            if smallest.peek().is_some_and(|top| text >= top.1) {
                continue;
            }
            smallest.pop();
        }
        smallest.push(ByLabel(row, text));
    }
    let mut tied: Vec<ByLabel<R, L>> = smallest.into_vec();
    tied.sort_by(|a, b| a.1.cmp(&b.1));
    labelled.extend(tied.into_iter().map(|ByLabel(row, text)| (row, text)));
    labelled
}

/// A row ordered by its label alone (for `rank`'s heap).
struct ByLabel<R, L>(R, L);

impl<R, L: Ord> PartialEq for ByLabel<R, L> {
    fn eq(&self, other: &Self) -> bool {
        self.1 == other.1
    }
}

impl<R, L: Ord> Eq for ByLabel<R, L> {}

impl<R, L: Ord> PartialOrd for ByLabel<R, L> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl<R, L: Ord> Ord for ByLabel<R, L> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.1.cmp(&other.1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_and_long_text_cut() {
        assert!(matches!(shown("Foo#bar"), Cow::Borrowed("Foo#bar")));
        assert_eq!(shown("a\u{1b}[31mred\u{7}\r"), "a\\u{1b}[31mred\\u{7}\\r");
        assert_eq!(shown("del\u{7f} c1\u{9b}"), "del\\u{7f} c1\\u{9b}");
        let long = "x".repeat(MAX_SHOWN_CHARS + 1);
        let cut = shown(&long);
        assert_eq!(cut.chars().count(), MAX_SHOWN_CHARS + 1);
        assert!(cut.ends_with('…'));
        let exact = "é".repeat(MAX_SHOWN_CHARS);
        assert!(matches!(shown(&exact), Cow::Borrowed(_)));
    }

    #[test]
    fn ranks_by_number_then_label_and_labels_only_what_it_must() {
        let rows = vec![(5, "e"), (9, "b"), (5, "a"), (5, "c"), (1, "z"), (9, "a")];
        let mut asked = Vec::new();
        let ranked = rank(
            rows.clone(),
            3,
            |r| r.0,
            |r| {
                asked.push(r.1);
                r.1.to_string()
            },
        );
        let labels: Vec<&str> = ranked.iter().map(|(_, l)| l.as_str()).collect();
        assert_eq!(labels, ["a", "b", "a"]);
        // The two 9s, and every 5 (tied with the third row); never the 1.
        asked.sort_unstable();
        assert_eq!(asked, ["a", "a", "b", "c", "e"]);
        // Of many tied rows, the smallest labels, in order.
        let tied: Vec<u32> = (0..10_000).rev().collect();
        let ranked = rank(tied, 3, |_| 1, |n| format!("{n:05}"));
        let labels: Vec<&str> = ranked.iter().map(|(_, l)| l.as_str()).collect();
        assert_eq!(labels, ["00000", "00001", "00002"]);
        let all = rank(rows, 0, |r| r.0, |r| r.1.to_string());
        let order: Vec<(i32, &str)> = all.iter().map(|(r, _)| *r).collect();
        assert_eq!(
            order,
            [(9, "a"), (9, "b"), (5, "a"), (5, "c"), (5, "e"), (1, "z")]
        );
        assert!(rank(Vec::<(i32, &str)>::new(), 5, |r| r.0, |r| r.1.to_string()).is_empty());
    }
}
