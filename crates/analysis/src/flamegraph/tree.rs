//! The merged call tree: built from the stacks with bounded memory, pruned
//! to what a page can draw, and its functions for the table.

use std::borrow::Cow;
use std::cmp::Ordering;
use std::fmt::Write as _;

use super::{FlameGraphInput, FlameStack};
use crate::display::shown;
use crate::units::{format_percent, format_value};
use crate::InputMap;
use sampler::fast_hash::FastHashMap;

/// One node of the merged tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Node {
    /// Indexes in `Tree::strings`.
    pub(super) name: u32,
    pub(super) file: u32,
    /// The frames' line, or 0 when they differ.
    pub(super) line: i64,
    /// The root is its own parent.
    pub(super) parent: u32,
    pub(super) depth: u32,
    /// Sum of the stacks through this node.
    pub(super) total: i64,
    /// Sum of the stacks that end here.
    pub(super) self_value: i64,
    /// Index just past this node's subtree: its descendants are `i + 1..end`.
    pub(super) end: u32,
}

/// A function of the table: its frames merged across the tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Function {
    pub(super) name: u32,
    pub(super) file: u32,
    pub(super) flat: i64,
    pub(super) cum: i64,
}

/// Nodes the call tree holds at most while it is built (about 90 bytes
/// each then): stacks met past it end at the node they reached. A 10 MB
/// profile of this gem makes fewer than a million.
pub(super) const MAX_TREE_NODES: usize = 2_000_000;

/// The call tree, nodes in depth-first order, children sorted by (name,
/// file); node 0 is the root, "all".
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Tree<'a> {
    /// Names and files, each once; 0 is "all", 1 is "".
    pub(super) strings: Vec<Cow<'a, str>>,
    pub(super) nodes: Vec<Node>,
    /// Stacks left out for their negative value, and their sum.
    pub(super) negative_stacks: usize,
    pub(super) negative_value: i64,
    /// Nodes `prune` dropped, all smaller than `pruned_below`.
    pub(super) pruned_nodes: usize,
    pub(super) pruned_below: i64,
    /// Stacks whose deeper frames were not added (MAX_TREE_NODES).
    pub(super) cut_stacks: usize,
}

impl<'a> Tree<'a> {
    pub(super) fn build<S: std::borrow::Borrow<FlameStack<'a>>>(
        stacks: impl IntoIterator<Item = S>,
    ) -> Tree<'a> {
        struct Building {
            name: u32,
            file: u32,
            line: i64,
            total: i64,
            self_value: i64,
            children: Vec<u32>,
        }
        let mut strings: Vec<&'a str> = Vec::new();
        let mut string_ids: InputMap<&'a str, u32> = InputMap::default();
        // By address first: a profile's frames borrow its string table, so
        // one name is one slice, hashed once however long it is and however
        // many frames use it.
        // (Addresses and our own ids are nobody's choice: FxHash is safe.)
        let mut slice_ids: FastHashMap<(usize, usize), u32> = FastHashMap::default();
        let mut intern = |s: &'a str| -> u32 {
            *slice_ids
                .entry((s.as_ptr() as usize, s.len()))
                .or_insert_with(|| {
                    *string_ids.entry(s).or_insert_with(|| {
                        strings.push(s);
                        (strings.len() - 1) as u32
                    })
                })
        };
        let root_name = intern("all");
        let root_file = intern("");
        let mut nodes = vec![Building {
            name: root_name,
            file: root_file,
            line: 0,
            total: 0,
            self_value: 0,
            children: Vec::new(),
        }];
        let mut child_ids: FastHashMap<(u32, u32, u32), u32> = FastHashMap::default();
        let (mut negative_stacks, mut negative_value) = (0, 0i64);
        let mut cut_stacks = 0;
        for stack in stacks {
            let stack = stack.borrow();
            let value = stack.value;
            if value <= 0 {
                if value < 0 {
                    negative_stacks += 1;
                    negative_value = negative_value.saturating_add(value);
                }
                continue;
            }
            let mut at = 0u32;
            nodes[0].total = nodes[0].total.saturating_add(value);
            for frame in &stack.frames {
                let key = (at, intern(frame.name), intern(frame.file));
                let new_id = nodes.len() as u32;
                if nodes.len() >= MAX_TREE_NODES && !child_ids.contains_key(&key) {
                    cut_stacks += 1;
                    break;
                }
                let child = *child_ids.entry(key).or_insert(new_id);
                if child == new_id {
                    nodes.push(Building {
                        name: key.1,
                        file: key.2,
                        line: frame.line,
                        total: 0,
                        self_value: 0,
                        children: Vec::new(),
                    });
                    nodes[at as usize].children.push(child);
                } else if nodes[child as usize].line != frame.line {
                    nodes[child as usize].line = 0;
                }
                let node = &mut nodes[child as usize];
                node.total = node.total.saturating_add(value);
                at = child;
            }
            let node = &mut nodes[at as usize];
            node.self_value = node.self_value.saturating_add(value);
        }
        drop(child_ids);

        // Depth-first order, children sorted; an explicit stack, as stacks
        // can be thousands of frames deep.
        let ranks = string_ranks(&strings);
        let mut ordered: Vec<Node> = Vec::with_capacity(nodes.len());
        let mut todo: Vec<(u32, u32, u32)> = vec![(0, 0, 0)]; // (building id, parent, depth)
        while let Some((id, parent, depth)) = todo.pop() {
            let new_id = ordered.len() as u32;
            let mut children = std::mem::take(&mut nodes[id as usize].children);
            let building = &nodes[id as usize];
            ordered.push(Node {
                name: building.name,
                file: building.file,
                line: building.line,
                parent,
                depth,
                total: building.total,
                self_value: building.self_value,
                end: new_id + 1,
            });
            children.sort_unstable_by(|&a, &b| {
                let (a, b) = (&nodes[a as usize], &nodes[b as usize]);
                compare_frames(&ranks, (a.name, a.file), (b.name, b.file))
            });
            todo.extend(
                children
                    .iter()
                    .rev()
                    .map(|&child| (child, new_id, depth + 1)),
            );
        }
        for i in (1..ordered.len()).rev() {
            let (parent, end) = (ordered[i].parent as usize, ordered[i].end);
            ordered[parent].end = ordered[parent].end.max(end);
        }
        // Strings renumbered in order of first use, so the output does not
        // depend on the order of the samples either; as reports show them
        // (control characters escaped, cut past MAX_SHOWN_CHARS).
        let mut renumbered = vec![u32::MAX; strings.len()];
        let mut used: Vec<Cow<'a, str>> = Vec::with_capacity(strings.len());
        for node in &mut ordered {
            for id in [&mut node.name, &mut node.file] {
                if renumbered[*id as usize] == u32::MAX {
                    renumbered[*id as usize] = used.len() as u32;
                    used.push(shown(strings[*id as usize]));
                }
                *id = renumbered[*id as usize];
            }
        }
        Tree {
            strings: used,
            nodes: ordered,
            negative_stacks,
            negative_value,
            pruned_nodes: 0,
            pruned_below: 0,
            cut_stacks,
        }
    }

    /// Keeps the `max_nodes` biggest nodes (by total; more on ties) and
    /// drops the rest. A node is never bigger than its parent, so what is
    /// kept is still a tree, in the same order; a parent's dropped children
    /// show as part of its own (self) width.
    pub(super) fn prune(&mut self, max_nodes: usize) {
        if self.nodes.len() <= max_nodes || max_nodes == 0 {
            return;
        }
        let mut totals: Vec<i64> = self.nodes.iter().map(|n| n.total).collect();
        let (_, threshold, _) = totals.select_nth_unstable_by(max_nodes - 1, |a, b| b.cmp(a));
        let threshold = (*threshold).max(1);
        let mut new_index = vec![u32::MAX; self.nodes.len()];
        let mut kept: Vec<Node> = Vec::with_capacity(max_nodes);
        for (i, node) in self.nodes.iter().enumerate() {
            if i == 0 || node.total >= threshold {
                new_index[i] = kept.len() as u32;
                let mut node = node.clone();
                node.parent = new_index[node.parent as usize];
                node.end = kept.len() as u32 + 1;
                kept.push(node);
            }
        }
        for i in (1..kept.len()).rev() {
            let (parent, end) = (kept[i].parent as usize, kept[i].end);
            kept[parent].end = kept[parent].end.max(end);
        }
        self.pruned_nodes = self.nodes.len() - kept.len();
        self.pruned_below = threshold;
        self.nodes = kept;
    }

    pub(super) fn total(&self) -> i64 {
        self.nodes[0].total
    }

    pub(super) fn is_empty(&self) -> bool {
        self.total() == 0
    }

    /// The text drawn on a frame: its name; the root's shows the total.
    pub(super) fn label(&self, i: usize, input: &FlameGraphInput<'_>) -> String {
        let node = &self.nodes[i];
        if i == 0 {
            format!("all ({})", format_value(node.total, &input.unit))
        } else {
            self.strings[node.name as usize].to_string()
        }
    }

    /// A frame's tooltip: name, file:line, value and self value.
    pub(super) fn describe(&self, i: usize, input: &FlameGraphInput<'_>) -> String {
        let node = &self.nodes[i];
        let total = self.total();
        let mut text = self.label(i, input);
        let file = &self.strings[node.file as usize];
        if !file.is_empty() {
            text.push('\n');
            text.push_str(file);
            if node.line > 0 {
                let _ = write!(text, ":{}", node.line);
            }
        }
        let _ = write!(
            text,
            "\n{} ({}) {}",
            format_value(node.total, &input.unit),
            format_percent(node.total, total),
            input.sample_type
        );
        if i > 0 {
            let _ = write!(
                text,
                "\nself: {} ({})",
                format_value(node.self_value, &input.unit),
                format_percent(node.self_value, total)
            );
        }
        text
    }

    /// Functions (name, file) with their flat and cum values, largest flat
    /// first. A recursive function's cum counts each stack once: only its
    /// outermost frame on a path adds to it.
    pub(super) fn functions(&self) -> Vec<Function> {
        let ranks = string_ranks(&self.strings);
        let mut functions: Vec<Function> = Vec::new();
        let mut function_ids: FastHashMap<(u32, u32), u32> = FastHashMap::default();
        let mut on_path: Vec<u32> = Vec::new(); // frames of each function on the path
        let mut path: Vec<(usize, u32)> = Vec::new(); // (node, function), root excluded
        for (i, node) in self.nodes.iter().enumerate().skip(1) {
            while let Some(&(top, function)) = path.last() {
                if (self.nodes[top].end as usize) > i {
                    break;
                }
                on_path[function as usize] -= 1;
                path.pop();
            }
            let function = *function_ids
                .entry((node.name, node.file))
                .or_insert_with(|| {
                    functions.push(Function {
                        name: node.name,
                        file: node.file,
                        flat: 0,
                        cum: 0,
                    });
                    on_path.push(0);
                    (functions.len() - 1) as u32
                });
            let entry = &mut functions[function as usize];
            entry.flat = entry.flat.saturating_add(node.self_value);
            if on_path[function as usize] == 0 {
                entry.cum = entry.cum.saturating_add(node.total);
            }
            on_path[function as usize] += 1;
            path.push((i, function));
        }
        functions.sort_by(|a, b| {
            b.flat
                .cmp(&a.flat)
                .then(b.cum.cmp(&a.cum))
                .then_with(|| compare_frames(&ranks, (a.name, a.file), (b.name, b.file)))
        });
        functions
    }
}

/// Frames ordered by name, then file, through `string_ranks`.
fn compare_frames(ranks: &[u32], a: (u32, u32), b: (u32, u32)) -> Ordering {
    let rank = |id: u32| ranks[id as usize];
    rank(a.0)
        .cmp(&rank(b.0))
        .then_with(|| rank(a.1).cmp(&rank(b.1)))
}

/// Each string's place among all of them in text order: strings are
/// compared once each here, then frames by number (names can be long, and
/// share long prefixes, and a tree sorts millions of children).
fn string_ranks<S: AsRef<str>>(strings: &[S]) -> Vec<u32> {
    let mut order: Vec<u32> = (0..strings.len() as u32).collect();
    order.sort_unstable_by(|&a, &b| {
        strings[a as usize]
            .as_ref()
            .cmp(strings[b as usize].as_ref())
    });
    let mut ranks = vec![0u32; strings.len()];
    for (rank, &index) in order.iter().enumerate() {
        ranks[index as usize] = rank as u32;
    }
    ranks
}
