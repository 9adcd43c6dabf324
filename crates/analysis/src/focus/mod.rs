//! `top --focus`: which frames a Ruby regular expression matches, by name
//! or file.
//!
//! A profile is untrusted input (anyone can hand one over), and Ruby's
//! Regexp backtracks: `/Order.*save/` over one 1,000,000-character name
//! (in a 1.6 KB profile) did not finish in a minute, holding the GVL, and
//! Ruby 3.1's Regexp has no timeout. So the pattern is matched by the regex
//! crate, in time linear in the text, after its Ruby syntax is rewritten
//! (ruby_syntax). What a linear-time matcher cannot do (backreferences,
//! look-around) is refused, saying so; a pattern too big to compile within
//! bounded memory too.

mod ruby_syntax;

use std::fmt;

use regex::{Regex, RegexBuilder};

use super::decoded_profile::DecodedProfile;
use super::InputMap;
pub use ruby_syntax::RubyOptions;

/// The longest pattern taken (hundreds of class names). Compiling costs
/// memory the compiled size limit does not bound (parsing, Unicode class
/// tables, literal search tables): 140 MB for a 1 MB alternation, 160 MB
/// for 64 kB of `\p{Alnum}`; at this length, about 60 MB at most.
pub const MAX_PATTERN_BYTES: usize = 16 << 10;
/// The most a compiled pattern may take.
pub const COMPILED_SIZE_LIMIT: usize = 10 << 20;
/// The lazy DFA's cache (the regex crate's default): when full it is
/// cleared, or the search goes on in another engine, linear still.
const DFA_SIZE_LIMIT: usize = 2 << 20;

/// Why a pattern cannot be used, worded to follow "focus /…/ ".
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FocusError {
    /// It uses what matching in linear time rules out ("a backreference (\1)").
    Unsupported(String),
    /// The regex crate refused it (an unknown Unicode property, say).
    Rejected(String),
    /// Longer than MAX_PATTERN_BYTES (its length).
    TooLong(usize),
    /// Compiled, bigger than COMPILED_SIZE_LIMIT.
    TooBig,
    NotUtf8,
}

impl fmt::Display for FocusError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FocusError::Unsupported(what) => write!(
                f,
                "uses {what}, which the linear-time matcher does not support \
                 (focus never backtracks, so that no profile can make it hang)"
            ),
            FocusError::Rejected(why) => {
                write!(f, "is not supported by the linear-time matcher: {why}")
            }
            FocusError::TooLong(bytes) => write!(
                f,
                "is {bytes} bytes long; focus takes patterns of at most {MAX_PATTERN_BYTES} bytes"
            ),
            FocusError::TooBig => write!(
                f,
                "is too big: compiled, it would take more than {} MB (focus's limit)",
                COMPILED_SIZE_LIMIT >> 20
            ),
            FocusError::NotUtf8 => write!(f, "is not valid UTF-8"),
        }
    }
}

/// A focus pattern, compiled.
#[derive(Debug)]
pub struct FocusPattern {
    regex: Regex,
}

impl FocusPattern {
    /// `source`: a Ruby Regexp's source (UTF-8); `options`: its options.
    pub fn new(source: &[u8], options: RubyOptions) -> Result<Self, FocusError> {
        if source.len() > MAX_PATTERN_BYTES {
            return Err(FocusError::TooLong(source.len()));
        }
        let source = std::str::from_utf8(source).map_err(|_| FocusError::NotUtf8)?;
        let translated = ruby_syntax::translate(source, options.extended)
            .map_err(|u| FocusError::Unsupported(u.0))?;
        let regex = RegexBuilder::new(&translated)
            .case_insensitive(options.ignore_case)
            .dot_matches_new_line(options.dot_all)
            // Ruby's ^ and $ match at every line's start and end.
            .multi_line(true)
            .size_limit(COMPILED_SIZE_LIMIT)
            .dfa_size_limit(DFA_SIZE_LIMIT)
            .build()
            .map_err(|error| match error {
                regex::Error::CompiledTooBig(_) => FocusError::TooBig,
                // The last line of a syntax error says what is wrong (the
                // lines before show the rewritten pattern).
                other => {
                    let text = other.to_string();
                    let last = text.lines().last().unwrap_or_default();
                    FocusError::Rejected(last.trim_start_matches("error: ").to_string())
                }
            })?;
        Ok(FocusPattern { regex })
    }

    pub fn is_match(&self, text: &str) -> bool {
        self.regex.is_match(text)
    }

    /// The frames (positions in `profile.frames`, ascending) whose name or
    /// file matches. Each distinct string is matched once: a long name can
    /// be shared by thousands of frames.
    pub fn matching_frames(&self, profile: &DecodedProfile) -> Vec<u32> {
        let mut matched: InputMap<u32, bool> = InputMap::default();
        let mut matches = |id: u32| {
            *matched
                .entry(id)
                .or_insert_with(|| self.is_match(profile.string(id)))
        };
        profile
            .frames
            .iter()
            .enumerate()
            .filter(|(_, frame)| matches(frame.name) || matches(frame.file))
            .map(|(index, _)| index as u32)
            .collect()
    }
}

#[cfg(test)]
mod tests;
