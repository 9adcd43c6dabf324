//! The profile comment that names the process a profile came from, written
//! at a flush and read back by the CLI (which must not mix processes up
//! when given the profiles of a preforking server's master and workers):
//!
//! ```text
//! process: pid 1234 (forked from pid 1200), started at unix time 1764974309.123, $0 "puma: cluster worker 0: 1200 [app]"
//! ```
//!
//! A comment, not a label: it survives renaming the file, and `go tool
//! pprof -comments` shows it.

use sampler::fast_hash::FastHashSet;

const PREFIX: &str = "process: pid ";
const FORKED: &str = " (forked from pid ";
const STARTED: &str = ", started at unix time ";
const PROGRAM: &str = ", $0 ";
/// A longer $0 (a process title can be long) is cut to this many bytes.
pub const MAX_PROGRAM_BYTES: usize = 200;

/// A process, as far as its profiles can tell.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProcessIdentity {
    pub pid: u32,
    /// The process's start (or, in a forked child, the fork) in
    /// milliseconds since the Unix epoch: with the pid, what tells one
    /// process from a later one that reused its pid.
    pub started_millis: i64,
    pub forked_from: Option<u32>,
    /// Ruby's $0 when the profile was written (servers set it to say what
    /// the process is: "puma: cluster worker 0: ...").
    pub program: String,
}

impl ProcessIdentity {
    pub fn comment(&self) -> String {
        let forked = self
            .forked_from
            .map(|parent| format!("{FORKED}{parent})"))
            .unwrap_or_default();
        let seconds = self.started_millis.div_euclid(1000);
        let millis = self.started_millis.rem_euclid(1000);
        format!(
            "{PREFIX}{}{forked}{STARTED}{seconds}.{millis:03}{PROGRAM}{}",
            self.pid,
            quote(truncate(&self.program, MAX_PROGRAM_BYTES))
        )
    }

    /// The identity in a comment written by `comment`, or None for any
    /// other comment.
    pub fn parse(comment: &str) -> Option<ProcessIdentity> {
        let rest = comment.strip_prefix(PREFIX)?;
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let pid = rest[..digits].parse().ok()?;
        let mut rest = &rest[digits..];
        let mut forked_from = None;
        if let Some(after) = rest.strip_prefix(FORKED) {
            let (parent, after) = after.split_once(')')?;
            forked_from = Some(parent.parse().ok()?);
            rest = after;
        }
        let rest = rest.strip_prefix(STARTED)?;
        let (time, program) = rest.split_once(PROGRAM)?;
        let (seconds, millis) = time.split_once('.')?;
        if millis.len() != 3 {
            return None;
        }
        let seconds: i64 = seconds.parse().ok()?;
        let millis: i64 = millis.parse().ok()?;
        Some(ProcessIdentity {
            pid,
            started_millis: seconds.checked_mul(1000)?.checked_add(millis)?,
            forked_from,
            program: unquote(program)?,
        })
    }
}

/// The processes a profile's comments name: one for a flushed profile,
/// several for a merge of processes' profiles, none for a profile from
/// elsewhere. Each once, in order.
pub fn processes_named<'a>(comments: impl IntoIterator<Item = &'a str>) -> Vec<ProcessIdentity> {
    // Keyed by (pid, start): one process, whatever its $0 said at each
    // flush. A set, not a scan of the list: a crafted profile can hold
    // tens of thousands of such comments.
    let mut seen: FastHashSet<(u32, i64)> = FastHashSet::default();
    comments
        .into_iter()
        .filter_map(ProcessIdentity::parse)
        .filter(|identity| seen.insert((identity.pid, identity.started_millis)))
        .collect()
}

/// The longest prefix of `text` within `max` bytes, on a character boundary.
fn truncate(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

fn quote(text: &str) -> String {
    let mut quoted = String::with_capacity(text.len() + 2);
    quoted.push('"');
    for c in text.chars() {
        match c {
            '"' | '\\' => {
                quoted.push('\\');
                quoted.push(c);
            }
            '\n' => quoted.push_str("\\n"),
            c => quoted.push(c),
        }
    }
    quoted.push('"');
    quoted
}

fn unquote(quoted: &str) -> Option<String> {
    let inner = quoted.strip_prefix('"')?.strip_suffix('"')?;
    let mut text = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next()? {
                'n' => text.push('\n'),
                escaped => text.push(escaped),
            }
        } else {
            text.push(c);
        }
    }
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker() -> ProcessIdentity {
        ProcessIdentity {
            pid: 1234,
            started_millis: 1_764_974_309_023,
            forked_from: Some(1200),
            program: "puma: cluster worker 0: 1200 [app]".into(),
        }
    }

    #[test]
    fn reads_back_what_it_writes() {
        let comment = worker().comment();
        assert_eq!(
            comment,
            "process: pid 1234 (forked from pid 1200), started at unix time 1764974309.023, \
             $0 \"puma: cluster worker 0: 1200 [app]\""
        );
        assert_eq!(ProcessIdentity::parse(&comment), Some(worker()));
        let master = ProcessIdentity {
            forked_from: None,
            program: String::new(),
            ..worker()
        };
        assert_eq!(ProcessIdentity::parse(&master.comment()), Some(master));
    }

    #[test]
    fn any_program_name_survives_quoting() {
        for program in [
            "a \"quoted\" name",
            "back\\slash",
            "line\nbreak",
            "\"",
            "\\",
            ", $0 \"x\"",
        ] {
            let identity = ProcessIdentity {
                program: program.into(),
                ..worker()
            };
            assert_eq!(
                ProcessIdentity::parse(&identity.comment()).map(|i| i.program),
                Some(program.to_string())
            );
        }
    }

    #[test]
    fn a_long_program_name_is_cut_on_a_character_boundary() {
        let identity = ProcessIdentity {
            program: "é".repeat(150),
            ..worker()
        };
        let read = ProcessIdentity::parse(&identity.comment()).unwrap();
        assert_eq!(read.program, "é".repeat(100));
    }

    #[test]
    fn a_merged_profile_names_each_process_once() {
        let master = ProcessIdentity {
            pid: 1200,
            forked_from: None,
            ..worker()
        };
        let comments = [
            worker().comment(),
            "other".into(),
            master.comment(),
            worker().comment(),
        ];
        assert_eq!(
            processes_named(comments.iter().map(String::as_str)),
            vec![worker(), master]
        );
    }

    #[test]
    fn many_process_comments_each_count_once() {
        // (The case a list scan made quadratic: 20,000 comments.)
        let comments: Vec<String> = (0..20_000u32)
            .map(|n| {
                ProcessIdentity {
                    pid: n / 2,
                    ..worker()
                }
                .comment()
            })
            .collect();
        let processes = processes_named(comments.iter().map(String::as_str));
        assert_eq!(processes.len(), 10_000);
        assert!(processes.iter().enumerate().all(|(i, p)| p.pid == i as u32));
    }

    #[test]
    fn other_comments_are_not_processes() {
        for comment in [
            "",
            "process: pid",
            "process: pid x, started at unix time 1.000, $0 \"\"",
            "process: pid 1, started at unix time 1.5, $0 \"\"",
            "process: pid 1 (forked from pid q), started at unix time 1.000, $0 \"\"",
            "process: pid 1, started at unix time 1.000, $0 unquoted",
            "process: pid 99999999999, started at unix time 1.000, $0 \"\"",
            "memprofiler_pprof_rs: sample_rate=0.01",
        ] {
            assert_eq!(ProcessIdentity::parse(comment), None, "{comment:?}");
        }
    }
}
