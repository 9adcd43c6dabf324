//! Blocks named as blocks. `rb_profile_frames` reports a frame that runs a
//! block, or a rescue/ensure clause, of a method as the method itself: it
//! returns the method entry it finds up the block's environment chain
//! (`thread_profile_frames` in vm_backtrace.c, the same from Ruby 3.1 to
//! 4.0). Named as is, `block in Foo#bar` would show up as a second
//! `Foo#bar`. What such a frame still tells is its line. So the binding
//! layer reads once per method where its blocks and clauses are
//! (`MethodBlocks`: first and last line of each), and `BlockAttribution`
//! picks for each frame of a stack which of them ran there.
//!
//! A line strictly inside a block (not its first or last line) is that
//! block's, or a nested block's: every line of a block written over several
//! lines but its first and last. A first or last line is shared with the
//! code around the block (`items.map { |i| i.to_s }` on one line, or
//! `end.compact`), and the stack decides, walked from the root:
//! - A frame called by a frame of the same method is a rescue or ensure
//!   clause if its line is in one (a clause runs in a frame pushed directly
//!   on its method's, or block's, frame); else the method's body if the
//!   body has code at its line (direct recursion); else a block (`Proc#call`
//!   pushes no frame of its own, nor does a `yield` from a recursive call).
//! - A block called by something else (an iterator) with a frame of its own
//!   method nearer the root is a block of what that frame ran (one level
//!   deeper). With no such frame, a frame is the method's body, unless its
//!   line is only a block's (a stored proc called after its method
//!   returned).
//! - An ensure clause's code also runs inline on the normal path, so its
//!   lines count as the code around it too.
//!
//! That is exact for code without recursion. Two kinds of recursion on a
//! line shared by a block and the code around it can be misnamed: `a`
//! calls `b` calls `a` (the inner `a` taken for a block), and a one-line
//! proc called by its own method (taken for direct recursion).

use crate::fast_hash::FastHashMap;

/// What kind of code a `BlockCode` is: which frames can run it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlockKind {
    /// A block: called by an iterator, `yield` or `Proc#call`, in a frame of
    /// its own.
    Block,
    /// A rescue clause: run, after a raise, in a frame pushed directly on the
    /// frame of the code it belongs to.
    Rescue,
    /// An ensure clause: the same after a raise; on the normal path Ruby runs
    /// a copy of its code inline, in the frame of the code it belongs to (so
    /// its lines are that code's too, and blocks in it are listed twice:
    /// under the clause and under that code).
    Ensure,
}

impl BlockKind {
    fn is_clause(self) -> bool {
        matches!(self, BlockKind::Rescue | BlockKind::Ensure)
    }
}

/// One block (or rescue/ensure clause) of a method, as the binding layer
/// read it from the method's instruction sequences.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BlockCode {
    /// Ruby's label for it, qualified: `block in Foo#bar`,
    /// `block (2 levels) in Foo#bar`, `rescue in Foo#bar`.
    pub name: String,
    pub start_line: i64,
    /// Its last line (the closing `end` or `}` of a block).
    pub end_line: i64,
    /// The block it is written in (an index into `MethodBlocks`' blocks,
    /// always smaller than its own), or None: directly in the method.
    pub parent: Option<usize>,
    pub kind: BlockKind,
}

impl BlockCode {
    fn covers(&self, line: i64) -> bool {
        self.start_line <= line && line <= self.end_line
    }

    fn holds_inside(&self, line: i64) -> bool {
        self.start_line < line && line < self.end_line
    }
}

/// Where a method's blocks are.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MethodBlocks {
    blocks: Vec<BlockCode>,
    /// Nesting level of each block: 1 directly in the method.
    depths: Vec<u32>,
    /// The blocks directly in the method's body, and directly in each block
    /// (so that a line's owner is found without comparing every pair).
    top_level: Vec<usize>,
    children: Vec<Vec<usize>>,
}

impl MethodBlocks {
    /// None if the description is inconsistent (a parent that is not an
    /// earlier block, a block ending before it starts) or there is no block:
    /// then the method's frames keep the method's name.
    pub fn new(blocks: Vec<BlockCode>) -> Option<MethodBlocks> {
        if blocks.is_empty() {
            return None;
        }
        let mut depths: Vec<u32> = Vec::with_capacity(blocks.len());
        let mut top_level = Vec::new();
        let mut children = vec![Vec::new(); blocks.len()];
        for (index, block) in blocks.iter().enumerate() {
            if block.end_line < block.start_line {
                return None;
            }
            let depth = match block.parent {
                None => {
                    top_level.push(index);
                    1
                }
                Some(parent) if parent < index => {
                    children[parent].push(index);
                    depths[parent] + 1
                }
                Some(_) => return None,
            };
            depths.push(depth);
        }
        Some(MethodBlocks {
            blocks,
            depths,
            top_level,
            children,
        })
    }

    pub fn block(&self, index: usize) -> &BlockCode {
        &self.blocks[index]
    }

    /// Whether code of `owner` (None: the method's body) can be at `line`:
    /// within its lines and not strictly inside one of its children.
    fn has_code_at(&self, owner: Option<usize>, line: i64) -> bool {
        let inner = match owner {
            Some(index) if !self.blocks[index].covers(line) => return false,
            Some(index) => &self.children[index],
            None => &self.top_level,
        };
        !inner.iter().any(|&child| {
            let child = &self.blocks[child];
            child.kind != BlockKind::Ensure && child.holds_inside(line)
        })
    }

    /// The blocks whose code can be at `line`: blocks, or clauses.
    fn at(&self, line: i64, clauses: bool) -> impl Iterator<Item = usize> + '_ {
        (0..self.blocks.len()).filter(move |&index| {
            let block = &self.blocks[index];
            block.kind.is_clause() == clauses
                && block.covers(line)
                && self.has_code_at(Some(index), line)
        })
    }

    fn depth(&self, choice: Option<usize>) -> u32 {
        choice.map_or(0, |index| self.depths[index])
    }

    /// What a frame at `line` ran, given `caller_ran`: what the frame that
    /// called it ran if that frame is of the same method (Some), and
    /// `context`: what the nearest frame of the same method toward the root
    /// ran (Some; None inside: the body).
    fn choose(
        &self,
        line: i64,
        caller_ran: Option<Option<usize>>,
        context: Option<Option<usize>>,
    ) -> Option<usize> {
        let in_body = self.has_code_at(None, line);
        let mut context = context;
        if let Some(caller_ran) = caller_ran {
            // Called by its own method's frame: a clause of what that frame
            // ran (or any clause there); else the body (direct recursion);
            // else, on a line only a block has, that block: Proc#call pushes
            // no frame, nor does a yield from a recursive call.
            let mut clauses = self.at(line, true);
            let first = clauses.next();
            if let Some(clause) = std::iter::once(first)
                .flatten()
                .chain(clauses)
                .find(|&c| self.blocks[c].parent == caller_ran)
                .or(first)
            {
                return Some(clause);
            }
            if in_body {
                return None;
            }
            context = Some(caller_ran);
        }
        let mut blocks = self.at(line, false);
        match (blocks.next(), blocks.next()) {
            (None, _) => return None,
            (Some(only), None) if !in_body => return Some(only),
            _ => {}
        }
        let Some(context) = context else {
            // No frame of the method below: its body, unless the line holds
            // none of the body's code (a block that outlived its method call,
            // e.g. a stored proc): then the outermost block there.
            return if in_body {
                None
            } else {
                self.at(line, false).min_by_key(|&b| self.depths[b])
            };
        };
        if let Some(child) = self
            .at(line, false)
            .find(|&b| self.blocks[b].parent == context)
        {
            return Some(child);
        }
        let deeper = self.depth(context);
        match self
            .at(line, false)
            .filter(|&b| self.depths[b] > deeper)
            .min_by_key(|&b| self.depths[b])
        {
            Some(block) => Some(block),
            None if in_body => None,
            None => self.at(line, false).next(),
        }
    }
}

/// A frame as `BlockAttribution` sees it: its method (a key equal for every
/// frame of the same method, and the method's blocks) and its line.
#[derive(Clone, Copy, Debug)]
pub struct FrameCode<'a> {
    pub method: Option<(u32, &'a MethodBlocks)>,
    pub line: i32,
}

/// Decides, stack by stack, which block of its method each frame ran.
/// Reused across stacks so that its buffers are allocated once.
#[derive(Default)]
pub struct BlockAttribution {
    /// Per method key: what the nearest frame of that method toward the
    /// root ran, while a stack is walked from its root.
    context: FastHashMap<u32, Option<usize>>,
    choices: Vec<Option<usize>>,
}

impl BlockAttribution {
    /// For each frame of `frames` (leaf first): the index of the block of
    /// its method that ran there, or None (the method's body, or a frame
    /// whose method has no blocks).
    pub fn attribute(&mut self, frames: &[FrameCode]) -> &[Option<usize>] {
        self.context.clear();
        self.choices.clear();
        self.choices.resize(frames.len(), None);
        for i in (0..frames.len()).rev() {
            let Some((key, blocks)) = frames[i].method else {
                continue;
            };
            let caller_is_same_method = frames
                .get(i + 1)
                .and_then(|caller| caller.method)
                .is_some_and(|(caller, _)| caller == key);
            let caller_ran = caller_is_same_method.then(|| self.choices[i + 1]);
            let context = self.context.get(&key).copied();
            let choice = blocks.choose(i64::from(frames[i].line), caller_ran, context);
            self.context.insert(key, choice);
            self.choices[i] = choice;
        }
        &self.choices
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(name: &str, lines: (i64, i64), parent: Option<usize>, kind: BlockKind) -> BlockCode {
        BlockCode {
            name: name.to_string(),
            start_line: lines.0,
            end_line: lines.1,
            parent,
            kind,
        }
    }

    fn block(name: &str, lines: (i64, i64), parent: Option<usize>) -> BlockCode {
        code(name, lines, parent, BlockKind::Block)
    }

    /// def bar                                 # 1
    ///   a = []                                # 2
    ///   3.times do                            # 3
    ///     a << 5.times.map { |i| i.to_s }     # 4
    ///     a.compact!                          # 5
    ///   end.size                              # 6
    ///   a.map { |x| x.size }                  # 7
    /// rescue                                  # 8
    ///   [].tap do |e|                         # 9
    ///     e << 1                              # 10
    ///   end                                   # 11
    /// end
    ///
    /// (Ruby names the block in the clause `block in Foo#bar` too; here it
    /// has a name of its own so that the tests can tell the two apart.)
    fn bar() -> MethodBlocks {
        MethodBlocks::new(vec![
            block("block in Foo#bar", (3, 6), None),
            block("block (2 levels) in Foo#bar", (4, 4), Some(0)),
            block("block in Foo#bar", (7, 7), None),
            code("rescue in Foo#bar", (9, 11), None, BlockKind::Rescue),
            block("block in rescue in Foo#bar", (9, 11), Some(3)),
        ])
        .expect("consistent")
    }

    fn names(blocks: &MethodBlocks, frames: &[FrameCode]) -> Vec<String> {
        let mut attribution = BlockAttribution::default();
        attribution
            .attribute(frames)
            .iter()
            .zip(frames)
            .map(|(choice, frame)| match (choice, frame.method) {
                (Some(b), _) => blocks.block(*b).name.clone(),
                (None, Some(_)) => "Foo#bar".to_string(),
                (None, None) => "other".to_string(),
            })
            .collect()
    }

    fn at(blocks: &MethodBlocks, line: i32) -> FrameCode<'_> {
        FrameCode {
            method: Some((7, blocks)),
            line,
        }
    }

    const OTHER: FrameCode<'static> = FrameCode {
        method: None,
        line: 0,
    };

    #[test]
    fn a_line_inside_a_block_names_it() {
        let b = bar();
        // The outer block at line 5, called by times from bar at line 3.
        let stack = [at(&b, 5), OTHER, at(&b, 3), OTHER];
        assert_eq!(
            names(&b, &stack),
            ["block in Foo#bar", "other", "Foo#bar", "other"]
        );
        // Its last line, `end.size`: the body's code there (Integer#size is
        // called by bar's frame).
        assert_eq!(
            names(&b, &[OTHER, at(&b, 6), OTHER]),
            ["other", "Foo#bar", "other"]
        );
    }

    #[test]
    fn lines_shared_by_nested_blocks_follow_the_stack() {
        let b = bar();
        // 2-level block at 4 <- map <- times' block at 4 <- times <- bar at 3.
        let stack = [at(&b, 4), OTHER, at(&b, 4), OTHER, at(&b, 3), OTHER];
        assert_eq!(
            names(&b, &stack),
            [
                "block (2 levels) in Foo#bar",
                "other",
                "block in Foo#bar",
                "other",
                "Foo#bar",
                "other"
            ]
        );
        // Allocated by map itself, called from the outer block at line 4.
        let stack = [OTHER, at(&b, 4), OTHER, at(&b, 3), OTHER];
        assert_eq!(
            names(&b, &stack),
            ["other", "block in Foo#bar", "other", "Foo#bar", "other"]
        );
    }

    #[test]
    fn a_one_line_block_and_its_caller_share_a_line() {
        let b = bar();
        // block at 7 <- map <- bar at 7.
        let stack = [at(&b, 7), OTHER, at(&b, 7), OTHER];
        assert_eq!(
            names(&b, &stack),
            ["block in Foo#bar", "other", "Foo#bar", "other"]
        );
        // The method's own allocation on that line.
        assert_eq!(names(&b, &[at(&b, 7), OTHER]), ["Foo#bar", "other"]);
    }

    #[test]
    fn a_rescue_clause_runs_on_its_methods_frame() {
        let b = bar();
        // Raised at line 2; the clause, at line 9, calls tap (a C method,
        // the leaf): rescue frame at 9 <- bar's frame at 2 <- main.
        assert_eq!(
            names(&b, &[OTHER, at(&b, 9), at(&b, 2), OTHER]),
            ["other", "rescue in Foo#bar", "Foo#bar", "other"]
        );
        // tap's block at 10 <- tap <- the clause at 9.
        let stack = [at(&b, 10), OTHER, at(&b, 9), at(&b, 2), OTHER];
        assert_eq!(
            names(&b, &stack),
            [
                "block in rescue in Foo#bar",
                "other",
                "rescue in Foo#bar",
                "Foo#bar",
                "other"
            ]
        );
    }

    #[test]
    fn a_block_called_with_no_frame_in_between_is_a_block() {
        // def m            # 1
        //   pr = proc do   # 2
        //     "x" * 2      # 3
        //   end            # 4
        //   pr.call        # 5   (Proc#call pushes no frame)
        // end
        let m = MethodBlocks::new(vec![block("block in m", (2, 4), None)]).expect("ok");
        let frame = |line| FrameCode {
            method: Some((5, &m)),
            line,
        };
        let mut attribution = BlockAttribution::default();
        assert_eq!(
            attribution.attribute(&[OTHER, frame(3), frame(5), OTHER]),
            [None, Some(0), None, None]
        );
    }

    #[test]
    fn an_ensure_clause_runs_inline_and_after_a_raise() {
        // def m(fail)                      # 1
        //   raise "boom" if fail           # 2
        // ensure                           # 3
        //   [1].each do |i|                # 4
        //     "x" * 2                      # 5
        //   end                            # 6
        // end
        // Ruby lists the block twice: in the body (the inline copy) and in
        // the clause.
        let m = MethodBlocks::new(vec![
            block("block in m", (4, 6), None),
            code("ensure in m", (4, 4), None, BlockKind::Ensure),
            block("block in ensure in m", (4, 6), Some(1)),
        ])
        .expect("ok");
        let frame = |line| FrameCode {
            method: Some((5, &m)),
            line,
        };
        let mut attribution = BlockAttribution::default();
        // Normal path: block at 5 <- each <- m at 4.
        assert_eq!(
            attribution.attribute(&[frame(5), OTHER, frame(4), OTHER]),
            [Some(0), None, None, None]
        );
        // After a raise at 2: block at 5 <- each <- ensure frame at 4 <- m at 2.
        assert_eq!(
            attribution.attribute(&[frame(5), OTHER, frame(4), frame(2), OTHER]),
            [Some(2), None, Some(1), None, None]
        );
    }

    #[test]
    fn recursion_through_a_one_line_block_alternates() {
        // def walk(n) = n.children.each { |c| walk(c) }   (all on line 1)
        let walk = MethodBlocks::new(vec![block("block in walk", (1, 1), None)]).expect("ok");
        let frame = |line| FrameCode {
            method: Some((3, &walk)),
            line,
        };
        let stack = [
            frame(1),
            frame(1),
            OTHER,
            frame(1),
            frame(1),
            OTHER,
            frame(1),
            OTHER,
        ];
        let mut attribution = BlockAttribution::default();
        assert_eq!(
            attribution.attribute(&stack),
            [None, Some(0), None, None, Some(0), None, None, None]
        );
    }

    #[test]
    fn direct_recursion_is_the_body() {
        let b = bar();
        assert_eq!(
            names(&b, &[at(&b, 2), at(&b, 2), at(&b, 2), OTHER]),
            ["Foo#bar", "Foo#bar", "Foo#bar", "other"]
        );
    }

    #[test]
    fn a_block_that_outlived_its_method_call_is_still_a_block() {
        let b = bar();
        // A stored proc from line 5's block, called later from elsewhere.
        assert_eq!(
            names(&b, &[at(&b, 5), OTHER]),
            ["block in Foo#bar", "other"]
        );
        // One on a line shared with the body, with no frame of the method
        // below: the body (the more likely reading).
        assert_eq!(names(&b, &[at(&b, 7), OTHER]), ["Foo#bar", "other"]);
    }

    #[test]
    fn lines_outside_every_block_and_line_zero_are_the_body() {
        let b = bar();
        assert_eq!(
            names(&b, &[at(&b, 0), at(&b, 99), OTHER]),
            ["Foo#bar", "Foo#bar", "other"]
        );
    }

    #[test]
    fn different_methods_do_not_share_context() {
        let b = bar();
        let other = bar();
        let other_frame = FrameCode {
            method: Some((8, &other)),
            line: 7,
        };
        // bar's frame at 7 below another method's frame at 7 with the same
        // shape: each is its own method's body.
        let stack = [other_frame, OTHER, at(&b, 7)];
        let mut attribution = BlockAttribution::default();
        assert_eq!(attribution.attribute(&stack), &[None, None, None]);
    }

    #[test]
    fn inconsistent_or_empty_descriptions_are_refused() {
        assert!(MethodBlocks::new(vec![]).is_none());
        assert!(MethodBlocks::new(vec![block("b", (1, 2), Some(0))]).is_none());
        assert!(
            MethodBlocks::new(vec![block("a", (1, 2), Some(1)), block("b", (1, 2), None)])
                .is_none()
        );
        assert!(MethodBlocks::new(vec![block("b", (5, 4), None)]).is_none());
    }
}
