//! Text from a profile as a report shows it, and the order rows are shown
//! in. A profile is input from anywhere: a name may hold terminal escape
//! sequences, or be 200 MB long. Reports show every name through `shown`,
//! and build labels only for the rows they print (`rank`).

use std::borrow::Cow;

/// Names longer than this many characters are cut, with "…" (real ones
/// are well below it; a C++ template name can reach a few hundred).
pub const MAX_SHOWN_CHARS: usize = 500;

/// `text` safe and bounded for a terminal or a page: control characters
/// (ESC, BEL, CR, DEL, the C1 range...) become visible escapes such as
/// `\u{1b}`, and past `MAX_SHOWN_CHARS` characters it is cut with "…".
/// Borrows when there is nothing to change (the common case).
pub fn shown(text: &str) -> Cow<'_, str> {
    let mut chars = 0usize;
    let mut clean = true;
    for c in text.chars() {
        chars += 1;
        if c.is_control() || chars > MAX_SHOWN_CHARS {
            clean = false;
            break;
        }
    }
    if clean {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len().min(MAX_SHOWN_CHARS * 4 + 8));
    for (count, c) in text.chars().enumerate() {
        if count == MAX_SHOWN_CHARS {
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
/// biggest first, ties by label, A to Z. Labels cost time and memory (a
/// crafted profile can make millions of rows with long names), so `label`
/// is asked only for the rows shown and the rows tied with the last of
/// them. Returns each row with its label.
pub fn rank<R, N: Ord + Copy>(
    mut rows: Vec<R>,
    keep: usize,
    number: impl Fn(&R) -> N,
    mut label: impl FnMut(&R) -> String,
) -> Vec<(R, String)> {
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
    let end = keep
        + rows[keep..]
            .iter()
            .take_while(|r| number(r) == boundary)
            .count();
    rows.truncate(end);
    let mut labelled: Vec<(R, String)> = rows
        .into_iter()
        .map(|row| {
            let text = label(&row);
            (row, text)
        })
        .collect();
    labelled.sort_by(|(a, a_label), (b, b_label)| {
        number(b).cmp(&number(a)).then_with(|| a_label.cmp(b_label))
    });
    labelled.truncate(keep);
    labelled
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
        let all = rank(rows, 0, |r| r.0, |r| r.1.to_string());
        let order: Vec<(i32, &str)> = all.iter().map(|(r, _)| *r).collect();
        assert_eq!(
            order,
            [(9, "a"), (9, "b"), (5, "a"), (5, "c"), (5, "e"), (1, "z")]
        );
        assert!(rank(Vec::<(i32, &str)>::new(), 5, |r| r.0, |r| r.1.to_string()).is_empty());
    }
}
