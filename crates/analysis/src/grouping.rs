//! What a row of a report is: a function, a line, a class, a file or a gem,
//! and how file paths are shortened so a table stays readable.

use super::decoded_profile::{DecodedProfile, FrameInfo};
use super::display::shown;
use crate::InputMap;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupBy {
    /// By function name (C methods called from many files are one row).
    Function,
    /// By function and line: the allocation site.
    Line,
    /// By the sampled object's class (the sample's class label).
    Class,
    /// By source file.
    File,
    /// By the gem the source file belongs to.
    Gem,
    /// By the value of a sample's string label with this key (a context
    /// label such as `endpoint`, set by `with_labels`).
    Label(String),
}

impl GroupBy {
    /// `function`, `line`, `class`, `file`, `gem`, or a label key: any
    /// other identifier (letters, digits, `_`, `.`; at most 64), or
    /// `label:KEY` for a key named like one of the others.
    pub fn parse(name: &str) -> Option<GroupBy> {
        Some(match name {
            "function" => GroupBy::Function,
            "line" => GroupBy::Line,
            "class" => GroupBy::Class,
            "file" => GroupBy::File,
            "gem" => GroupBy::Gem,
            _ => {
                let key = name.strip_prefix("label:").unwrap_or(name);
                let mut chars = key.chars();
                let identifier = key.len() <= 64
                    && chars
                        .next()
                        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                    && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.');
                if !identifier {
                    return None;
                }
                GroupBy::Label(key.to_string())
            }
        })
    }

    pub fn plural(&self) -> String {
        match self {
            GroupBy::Function => "functions".into(),
            GroupBy::Line => "lines".into(),
            GroupBy::Class => "classes".into(),
            GroupBy::File => "files".into(),
            GroupBy::Gem => "gems".into(),
            GroupBy::Label(key) => format!("values of label {key}"),
        }
    }

    /// Whether rows come from frames (and so have a cumulative value).
    pub fn is_per_frame(&self) -> bool {
        !matches!(self, GroupBy::Class | GroupBy::Label(_))
    }

    /// The row of samples without the label grouped by.
    pub fn unlabelled_row(&self) -> String {
        match self {
            GroupBy::Label(key) => format!("(no {key} label)"),
            _ => "(no class label)".into(),
        }
    }
}

/// Shortens file paths for display: relative to `base_dir` when under it,
/// from the gem directory for gems, from `ruby/X.Y.Z` for the standard library.
#[derive(Debug, Clone, Default)]
pub struct PathShortener {
    base_dir: String,
}

impl PathShortener {
    pub fn new(base_dir: &str) -> PathShortener {
        PathShortener {
            base_dir: base_dir.trim_end_matches('/').to_string(),
        }
    }

    pub fn shorten<'a>(&self, path: &'a str) -> &'a str {
        if !self.base_dir.is_empty() {
            if let Some(rest) = path.strip_prefix(self.base_dir.as_str()) {
                if let Some(rest) = rest.strip_prefix('/') {
                    return rest;
                }
            }
        }
        for marker in ["/gems/", "/vendor_ruby/"] {
            if let Some(at) = path.rfind(marker) {
                return &path[at + marker.len()..];
            }
        }
        if let Some(at) = path.find("/lib/ruby/") {
            return &path[at + "/lib/".len()..];
        }
        path
    }
}

/// The gem a source file belongs to, or what kind of file it is:
/// `puma` for `.../gems/puma-6.4.0/lib/puma/server.rb`, `(ruby stdlib)`,
/// `(ruby core)` for `<internal:...>`, `(no file)`, and `(app)` for the rest.
pub fn gem_of(path: &str) -> String {
    if path.is_empty() {
        return "(no file)".to_string();
    }
    if path.starts_with("<internal:") {
        return "(ruby core)".to_string();
    }
    if let Some(at) = path.rfind("/gems/") {
        let dir = path[at + "/gems/".len()..].split('/').next().unwrap_or("");
        return strip_version(dir).to_string();
    }
    // Debian's packaged gems: /usr/lib/ruby/vendor_ruby/rack/...
    if let Some(at) = path.rfind("/vendor_ruby/") {
        let first = path[at + "/vendor_ruby/".len()..]
            .split('/')
            .next()
            .unwrap_or("");
        return first.trim_end_matches(".rb").to_string();
    }
    if is_stdlib(path) {
        return "(ruby stdlib)".to_string();
    }
    "(app)".to_string()
}

/// `puma-6.4.0` → `puma`, `nokogiri-1.16.0-x86_64-linux` → `nokogiri`,
/// `my-gem-abc123def` (bundler git checkout) → `my-gem`.
fn strip_version(dir: &str) -> &str {
    let mut end = dir.len();
    for (at, _) in dir.match_indices('-') {
        let rest = &dir[at + 1..];
        let versionish = rest.starts_with(|c: char| c.is_ascii_digit())
            || (rest.len() >= 7 && rest.chars().take(7).all(|c| c.is_ascii_hexdigit()));
        if versionish {
            end = at;
            break;
        }
    }
    &dir[..end]
}

/// `/usr/lib/ruby/3.1.0/net/http.rb`, `/opt/ruby/lib/ruby/3.3.0/set.rb`.
fn is_stdlib(path: &str) -> bool {
    let Some(at) = path.find("/lib/ruby/") else {
        return false;
    };
    let rest = &path[at + "/lib/ruby/".len()..];
    let version = rest.split('/').next().unwrap_or("");
    !version.is_empty()
        && version
            .split('.')
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// The row label of a frame under `by` (not for `GroupBy::Class`), its
/// names as `display::shown` makes them.
pub fn frame_label(
    profile: &DecodedProfile,
    frame: &FrameInfo,
    by: &GroupBy,
    paths: &PathShortener,
) -> String {
    let name = shown(profile.string(frame.name));
    let file = profile.string(frame.file);
    match by {
        GroupBy::Function | GroupBy::Class | GroupBy::Label(_) => name.into_owned(),
        GroupBy::Line => {
            if file.is_empty() {
                name.into_owned()
            } else {
                format!("{name} {}:{}", shown(paths.shorten(file)), frame.line)
            }
        }
        GroupBy::File => {
            if file.is_empty() {
                "(no file)".to_string()
            } else {
                shown(paths.shorten(file)).into_owned()
            }
        }
        GroupBy::Gem => shown(&gem_of(file)).into_owned(),
    }
}

/// Which row of a per-frame report (`by` is not `Class`) each frame of a
/// profile is in: frames with the same label share a row. Compared by
/// string indexes, never by copying names (one can be 200 MB, and used by
/// thousands of frames).
pub struct FrameGroups {
    /// The row of each frame, by frame index.
    pub of_frame: Vec<u32>,
    /// A frame of each row, to label it with `frame_label`.
    pub representative: Vec<u32>,
}

impl FrameGroups {
    pub fn new(profile: &DecodedProfile, by: &GroupBy, paths: &PathShortener) -> FrameGroups {
        const NO_FILE: u32 = u32::MAX;
        // Per file string: its shortened path's (or gem's) id, computed once.
        let mut file_key: InputMap<u32, u32> = InputMap::default();
        let mut texts: InputMap<String, u32> = InputMap::default();
        let mut groups: InputMap<(u32, u32, i64), u32> = InputMap::default();
        let mut representative = Vec::new();
        let of_frame = profile
            .frames
            .iter()
            .enumerate()
            .map(|(index, frame)| {
                let file = if profile.string(frame.file).is_empty() {
                    NO_FILE
                } else {
                    *file_key.entry(frame.file).or_insert_with(|| {
                        let path = profile.string(frame.file);
                        let text = match by {
                            GroupBy::Gem => gem_of(path),
                            _ => paths.shorten(path).to_string(),
                        };
                        let next = texts.len() as u32;
                        *texts.entry(text).or_insert(next)
                    })
                };
                let key = match by {
                    GroupBy::Function | GroupBy::Class | GroupBy::Label(_) => (frame.name, 0, 0),
                    GroupBy::Line if file == NO_FILE => (frame.name, NO_FILE, 0),
                    GroupBy::Line => (frame.name, file, frame.line),
                    GroupBy::File => (file, 0, 0),
                    GroupBy::Gem if file == NO_FILE => {
                        // gem_of("") is "(no file)": one row with the rest.
                        let next = texts.len() as u32;
                        (*texts.entry(gem_of("")).or_insert(next), 0, 0)
                    }
                    GroupBy::Gem => (file, 0, 0),
                };
                let next = representative.len() as u32;
                *groups.entry(key).or_insert_with(|| {
                    representative.push(index as u32);
                    next
                })
            })
            .collect();
        FrameGroups {
            of_frame,
            representative,
        }
    }
}

/// `Integer#to_s in App#handle at app.rb:46`: the leaf, and for a C method
/// (no start line, so the file and line are its caller's) the method that
/// called it. Names an allocation site in one line.
pub fn describe_site(profile: &DecodedProfile, sample: usize, paths: &PathShortener) -> String {
    let mut frames = profile.stack(sample);
    let Some(leaf) = frames.next() else {
        return "(no frames)".to_string();
    };
    let name = shown(profile.string(leaf.name));
    let file = profile.string(leaf.file);
    let at = if file.is_empty() {
        String::new()
    } else {
        format!(" at {}:{}", shown(paths.shorten(file)), leaf.line)
    };
    if leaf.start_line == 0 {
        if let Some(caller) = frames.find(|f| f.start_line != 0) {
            return format!("{name} in {}{at}", shown(profile.string(caller.name)));
        }
    }
    format!("{name}{at}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gems_and_kinds_of_file() {
        assert_eq!(
            gem_of("/var/lib/gems/3.1.0/gems/puma-6.4.0/lib/puma/server.rb"),
            "puma"
        );
        assert_eq!(
            gem_of("/home/u/.gem/ruby/3.3.0/gems/nokogiri-1.16.0-x86_64-linux/lib/n.rb"),
            "nokogiri"
        );
        assert_eq!(
            gem_of("/b/ruby/3.3.0/bundler/gems/my-gem-0a1b2c3d4e5f/lib/my_gem.rb"),
            "my-gem"
        );
        assert_eq!(gem_of("/usr/lib/ruby/vendor_ruby/rack/utils.rb"), "rack");
        assert_eq!(gem_of("/usr/lib/ruby/vendor_ruby/puma.rb"), "puma");
        assert_eq!(gem_of("/usr/lib/ruby/3.1.0/net/http.rb"), "(ruby stdlib)");
        assert_eq!(
            gem_of("/opt/rubies/3.3.6/lib/ruby/3.3.0/set.rb"),
            "(ruby stdlib)"
        );
        assert_eq!(gem_of("<internal:kernel>"), "(ruby core)");
        assert_eq!(gem_of(""), "(no file)");
        assert_eq!(gem_of("/srv/app/lib/ruby/helpers.rb"), "(app)");
        assert_eq!(gem_of("examples/leaky_app.rb"), "(app)");
    }

    #[test]
    fn paths_are_shortened() {
        let paths = PathShortener::new("/srv/app/");
        assert_eq!(paths.shorten("/srv/app/models/user.rb"), "models/user.rb");
        assert_eq!(paths.shorten("/srv/application.rb"), "/srv/application.rb");
        assert_eq!(
            paths.shorten("/var/lib/gems/3.1.0/gems/puma-6.4.0/lib/puma/server.rb"),
            "puma-6.4.0/lib/puma/server.rb"
        );
        assert_eq!(
            paths.shorten("/usr/lib/ruby/3.1.0/set.rb"),
            "ruby/3.1.0/set.rb"
        );
        assert_eq!(
            paths.shorten("/usr/lib/ruby/vendor_ruby/rack/utils.rb"),
            "rack/utils.rb"
        );
        assert_eq!(PathShortener::new("").shorten("x.rb"), "x.rb");
    }

    #[test]
    fn group_names_parse() {
        assert_eq!(GroupBy::parse("function"), Some(GroupBy::Function));
        assert_eq!(GroupBy::parse("line"), Some(GroupBy::Line));
        assert_eq!(GroupBy::parse("class"), Some(GroupBy::Class));
        assert_eq!(GroupBy::parse("file"), Some(GroupBy::File));
        assert_eq!(GroupBy::parse("gem"), Some(GroupBy::Gem));
        assert_eq!(
            GroupBy::parse("endpoint"),
            Some(GroupBy::Label("endpoint".into()))
        );
        assert_eq!(
            GroupBy::parse("label:file"),
            Some(GroupBy::Label("file".into()))
        );
        for refused in ["", "label:", "9x", "with-dash", "a b", &"k".repeat(65)] {
            assert_eq!(GroupBy::parse(refused), None, "{refused:?}");
        }
        assert_eq!(
            GroupBy::Label("endpoint".into()).plural(),
            "values of label endpoint"
        );
        assert!(!GroupBy::Label("endpoint".into()).is_per_frame());
        assert_eq!(GroupBy::Class.plural(), "classes");
        assert!(!GroupBy::Class.is_per_frame());
    }
}
