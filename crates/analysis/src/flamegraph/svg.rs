//! A static SVG of the flame graph, for a file or a page that cannot run
//! JavaScript.

use std::fmt::Write as _;

use super::tree::Node;
use super::{
    cut_note, negative_note, no_samples_message, pruned_note, push_escaped, FlameGraphInput,
};
use crate::units::{format_percent, format_value};

const SVG_WIDTH: f64 = 1200.0;
const SVG_PAD: f64 = 10.0;
const SVG_ROW: f64 = 17.0;
const SVG_FONT: f64 = 12.0;
/// Frames narrower than this many pixels are not drawn (nor their callees).
const MIN_WIDTH: f64 = 0.5;
/// Nodes in an SVG at most (its frames narrower than half a pixel are left
/// out anyway; a 1200-pixel-wide picture shows far fewer).
const MAX_SVG_NODES: usize = 20_000;

/// A static SVG, 1200 px wide; `<title>`s give each frame's details on hover.
/// Frames narrower than half a pixel are left out, and their parent's
/// `<title>` says how many and how much they hold.
pub fn render_svg(input: &FlameGraphInput<'_>) -> String {
    // Each drawn frame repeats its names in its <title>: the biggest
    // MAX_SVG_NODES at most, so the file stays a few MB.
    let mut pruned = input.tree.clone();
    pruned.prune(MAX_SVG_NODES);
    let tree = &pruned;
    let total = tree.total();
    let mut notes = Vec::new();
    if tree.is_empty() {
        notes.push(no_samples_message(input));
    }
    notes.extend(negative_note(input, tree));
    notes.extend(cut_note(tree));
    notes.extend(pruned_note(input, tree));
    let graph_top = 52.0 + 16.0 * notes.len() as f64;
    let scale = (SVG_WIDTH - 2.0 * SVG_PAD) / total.max(1) as f64;
    let width_of = |node: &Node| node.total as f64 * scale;

    // Which frames are drawn, and what their parents say of the others.
    let nodes = &tree.nodes;
    let mut hidden_count = vec![0usize; nodes.len()];
    let mut hidden_value = vec![0i64; nodes.len()];
    let mut max_depth = 0;
    let mut i = 0;
    while i < nodes.len() && !tree.is_empty() {
        let node = &nodes[i];
        if i > 0 && width_of(node) < MIN_WIDTH {
            hidden_count[node.parent as usize] += 1;
            hidden_value[node.parent as usize] =
                hidden_value[node.parent as usize].saturating_add(node.total);
            i = node.end as usize;
        } else {
            max_depth = max_depth.max(node.depth);
            i += 1;
        }
    }
    let height = if tree.is_empty() {
        graph_top + SVG_PAD
    } else {
        graph_top + f64::from(max_depth + 1) * SVG_ROW + SVG_PAD
    };

    let mut out = String::with_capacity(256 * nodes.len().min(20_000));
    let _ = write!(
        out,
        "<?xml version=\"1.0\" encoding=\"UTF-8\" standalone=\"no\"?>\n\
         <svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{SVG_WIDTH}\" height=\"{height}\" \
         viewBox=\"0 0 {SVG_WIDTH} {height}\" font-family=\"Verdana, 'DejaVu Sans', sans-serif\" \
         font-size=\"{SVG_FONT}\">\n\
         <style>g:hover rect {{ stroke: #333; stroke-width: 0.5; }} text {{ pointer-events: none; }}</style>\n\
         <rect width=\"100%\" height=\"100%\" fill=\"#fdfaf6\"/>\n"
    );
    let _ = write!(
        out,
        "<text x=\"{}\" y=\"24\" text-anchor=\"middle\" font-size=\"17\">",
        SVG_WIDTH / 2.0
    );
    push_escaped(&mut out, &input.title);
    let _ = write!(
        out,
        "</text>\n<text x=\"{}\" y=\"42\" text-anchor=\"middle\" fill=\"#555\">",
        SVG_WIDTH / 2.0
    );
    push_escaped(&mut out, &input.subtitle);
    out.push_str("</text>\n");
    for (k, note) in notes.iter().enumerate() {
        let _ = write!(
            out,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" fill=\"#8a5a00\">",
            SVG_WIDTH / 2.0,
            58.0 + 16.0 * k as f64
        );
        push_escaped(&mut out, note);
        out.push_str("</text>\n");
    }
    if tree.is_empty() {
        out.push_str("</svg>\n");
        return out;
    }

    // Left edges, in value units: a node starts where its previous sibling ends.
    let mut left = vec![0i64; nodes.len()];
    let mut next_child = vec![0i64; nodes.len()];
    for i in 1..nodes.len() {
        let parent = nodes[i].parent as usize;
        left[i] = next_child[parent];
        next_child[parent] = next_child[parent].saturating_add(nodes[i].total);
        next_child[i] = left[i];
    }
    let mut i = 0;
    while i < nodes.len() {
        let node = &nodes[i];
        let width = width_of(node);
        if i > 0 && width < MIN_WIDTH {
            i = node.end as usize;
            continue;
        }
        let x = SVG_PAD + left[i] as f64 * scale;
        let y = graph_top + f64::from(node.depth) * SVG_ROW;
        out.push_str("<g><title>");
        let mut title = tree.describe(i, input);
        if hidden_count[i] > 0 {
            let _ = write!(
                title,
                "\n{} smaller {} not drawn: {} ({})",
                hidden_count[i],
                if hidden_count[i] == 1 {
                    "callee"
                } else {
                    "callees"
                },
                format_value(hidden_value[i], &input.unit),
                format_percent(hidden_value[i], total)
            );
        }
        push_escaped(&mut out, &title);
        let (r, g, b) = if i == 0 {
            ROOT_COLOR
        } else {
            frame_color(&tree.strings[node.name as usize])
        };
        let _ = write!(
            out,
            "</title><rect x=\"{x:.2}\" y=\"{y:.1}\" width=\"{:.2}\" height=\"{:.1}\" rx=\"2\" \
             fill=\"rgb({r},{g},{b})\"/>",
            (width - 0.5).max(0.1),
            SVG_ROW - 1.0
        );
        let label = tree.label(i, input);
        if let Some(text) = fit_label(&label, width) {
            let _ = write!(out, "<text x=\"{:.2}\" y=\"{:.1}\">", x + 3.0, y + 12.0);
            push_escaped(&mut out, &text);
            out.push_str("</text>");
        }
        out.push_str("</g>\n");
        i += 1;
    }
    out.push_str("</svg>\n");
    out
}

/// `label` cut to what fits in `width` pixels (about 0.6 em a character),
/// ending in ".." when cut; None when not even 3 characters fit.
pub(super) fn fit_label(label: &str, width: f64) -> Option<String> {
    let fits = ((width - 6.0) / (SVG_FONT * 0.6)).floor();
    if fits < 3.0 {
        return None;
    }
    let fits = fits as usize;
    if label.chars().count() <= fits {
        return Some(label.to_string());
    }
    let mut cut: String = label.chars().take(fits - 2).collect();
    cut.push_str("..");
    Some(cut)
}

/// A warm color (red to yellow) picked by a hash of the frame's name, so a
/// function keeps its color across runs and profiles. page.js's `frameColor`
/// computes the same one.
pub(super) fn frame_color(name: &str) -> (u32, u32, u32) {
    // FNV-1a over UTF-16 code units, as JavaScript sees the string.
    let mut hash: u32 = 0x811c_9dc5;
    for unit in name.encode_utf16() {
        hash ^= u32::from(unit);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    let (v1, v2, v3) = (hash & 0xff, (hash >> 8) & 0xff, (hash >> 16) & 0xff);
    (205 + 50 * v1 / 255, 80 + 120 * v2 / 255, 40 + 50 * v3 / 255)
}

const ROOT_COLOR: (u32, u32, u32) = (214, 204, 190);
