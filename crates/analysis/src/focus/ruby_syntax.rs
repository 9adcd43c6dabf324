//! A Ruby Regexp's source (Onigmo's syntax, as Ruby 3.1 reads it) written
//! in the regex crate's syntax. Most of it reads the same in both; where
//! the two read the same text differently, the Ruby meaning is written
//! out, and what a linear-time matcher cannot do (backreferences,
//! look-around, atomic groups, possessive quantifiers) is refused with
//! what it is. spec/memprofiler_pprof_rs/readers/profile_focus_spec.rb checks the result against Ruby's
//! own Regexp on the same names.
//!
//! The differences handled:
//! - `\d \w \s \h` (and `\D \W \S \H`) are ASCII in Ruby, Unicode in the
//!   regex crate (`\h` is a hex digit in Ruby, unknown to it): written as
//!   ASCII classes. `\b` is Unicode in both.
//! - POSIX brackets (`[[:alpha:]]`) and `\p{Alnum}`-style POSIX properties
//!   are Unicode in Ruby, ASCII (or unknown) in the regex crate: written as
//!   the Unicode properties Onigmo uses (same characters, up to the newer
//!   Unicode version the regex crate has).
//! - Ruby's `m` option (`/m`, `(?m)`) makes `.` match a newline: the regex
//!   crate's `s`. `^` and `$` are always line anchors in Ruby: the regex
//!   crate's `m`, which the caller turns on.
//! - `x` (extended) is done here, not by the regex crate, which would also
//!   drop whitespace inside `[...]` (Ruby keeps it).
//! - A `{` that is not a repetition (`{foo}`, `a{`) is a literal in Ruby,
//!   an error in the regex crate; `{,n}` is `{0,n}`.
//! - `\<` and `\>` are literals in Ruby, word boundaries in the regex crate;
//!   `--` and `~~` in a class are operators in the regex crate only.
//! - `\xHH` above 7F is a byte of a multibyte character in Ruby: refused.
//!
//! Left as the regex crate has it: with `i`, Ruby case-folds no non-ASCII
//! range or property (`/[À-Þ]/i` and `/\p{Lu}/i` miss "é", `/[É]/i` does
//! not), the regex crate folds them all; and its Unicode tables are newer
//! than Ruby 3.1's (Unicode 13), so newer characters have their properties.

/// Regexp#options bits that change what matches (the others, such as
/// FIXEDENCODING, are ignored).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RubyOptions {
    /// `/i`
    pub ignore_case: bool,
    /// `/x`: whitespace and `#` comments outside `[...]` are ignored.
    pub extended: bool,
    /// `/m`: `.` matches a newline too (the regex crate's `s`).
    pub dot_all: bool,
}

impl RubyOptions {
    /// Regexp::IGNORECASE, Regexp::EXTENDED, Regexp::MULTILINE.
    pub const IGNORECASE: u64 = 1;
    pub const EXTENDED: u64 = 2;
    pub const MULTILINE: u64 = 4;

    pub fn from_bits(bits: u64) -> Self {
        RubyOptions {
            ignore_case: bits & Self::IGNORECASE != 0,
            extended: bits & Self::EXTENDED != 0,
            dot_all: bits & Self::MULTILINE != 0,
        }
    }
}

/// What a pattern uses that the regex crate cannot do, as the object of
/// "uses": "a backreference (\1)".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsupported(pub String);

/// `source` in the regex crate's syntax. `extended`: the pattern's `/x`.
/// Errors Ruby itself would report are left for the regex crate to find
/// (the source of a Regexp has none).
pub fn translate(source: &str, extended: bool) -> Result<String, Unsupported> {
    Translator {
        chars: source.chars().collect(),
        at: 0,
        out: String::with_capacity(source.len() + 16),
        extended,
        groups: Vec::new(),
    }
    .run()
}

/// A POSIX class by name, as Onigmo defines it for Unicode strings: the
/// items of a regex crate class (inside `[...]`).
fn posix_items(name: &str) -> Option<&'static str> {
    Some(match name {
        "alnum" => r"\p{Alphabetic}\p{Nd}",
        "alpha" => r"\p{Alphabetic}",
        "ascii" => r"\x00-\x7F",
        "blank" => r"\p{Zs}\t",
        "cntrl" => r"\p{Cc}",
        "digit" => r"\p{Nd}",
        "graph" => r"[\p{Assigned}&&[^\s\p{Cc}]]",
        "lower" => r"\p{Lowercase}",
        "print" => r"[\p{Assigned}&&[^\s\p{Cc}]]\p{Zs}",
        "punct" => r"\p{P}\$\+<=>\^`\|\~",
        "space" => r"\s",
        "upper" => r"\p{Uppercase}",
        "xdigit" => r"0-9A-Fa-f",
        "word" => r"\p{Alphabetic}\p{M}\p{Nd}\p{Pc}",
        _ => return None,
    })
}

/// What an escape inside `[...]` stood for: one character (which can end
/// or start a range) or a set.
#[derive(PartialEq, Eq)]
enum Item {
    Char,
    Set,
}

/// Where a class is in reading its items, for telling a `-` between two
/// characters (a range) from a literal one.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ClassState {
    /// At the start, or after a set or a range.
    Open,
    /// After one character: a `-` next makes a range.
    AfterChar,
    /// After `a-`: the next item ends the range.
    RangeEnd,
}

struct Translator {
    chars: Vec<char>,
    at: usize,
    out: String,
    /// Whether `x` is on here.
    extended: bool,
    /// For each open group, whether `x` was on outside it.
    groups: Vec<bool>,
}

impl Translator {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.at).copied()
    }

    fn peek_at(&self, ahead: usize) -> Option<char> {
        self.chars.get(self.at + ahead).copied()
    }

    fn next(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.at += 1;
        Some(c)
    }

    fn run(mut self) -> Result<String, Unsupported> {
        // The last thing read was `*`, `+` or `?` as a repetition: a `+`
        // right after it makes it possessive.
        let mut after_repetition = false;
        while let Some(c) = self.next() {
            let repetition = std::mem::take(&mut after_repetition);
            match c {
                '\\' => {
                    self.escape(false)?;
                }
                '[' => self.class()?,
                '(' => self.group()?,
                ')' => {
                    if let Some(extended) = self.groups.pop() {
                        self.extended = extended;
                    }
                    self.out.push(')');
                }
                '+' if repetition => {
                    return Err(Unsupported(
                        "a possessive quantifier (*+, ++ or ?+)".to_string(),
                    ));
                }
                '*' | '+' => {
                    self.out.push(c);
                    after_repetition = true;
                }
                '?' => {
                    self.out.push('?');
                    // `a??` is lazy; `a?+` possessive.
                    after_repetition = !repetition;
                }
                '{' => self.interval(),
                '}' | ']' => {
                    self.out.push('\\');
                    self.out.push(c);
                }
                '#' if self.extended => while self.next().is_some_and(|c| c != '\n') {},
                ' ' | '\t' | '\n' | '\r' | '\x0B' | '\x0C' if self.extended => {}
                _ => self.out.push(c),
            }
        }
        Ok(self.out)
    }

    /// After a `\`: writes what it stands for.
    fn escape(&mut self, in_class: bool) -> Result<Item, Unsupported> {
        let Some(c) = self.next() else {
            // A trailing backslash: the regex crate reports it.
            self.out.push('\\');
            return Ok(Item::Char);
        };
        let set = match c {
            'd' => "[0-9]",
            'D' => "[^0-9]",
            'w' => "[0-9A-Za-z_]",
            'W' => "[^0-9A-Za-z_]",
            's' => r"[\t\n\x0B\x0C\r\x20]",
            'S' => r"[^\t\n\x0B\x0C\r\x20]",
            'h' => "[0-9A-Fa-f]",
            'H' => "[^0-9A-Fa-f]",
            'p' | 'P' => return Ok(self.property(c == 'P')),
            _ => "",
        };
        if !set.is_empty() {
            // A nested class is a set inside `[...]` too.
            self.out.push_str(set);
            return Ok(Item::Set);
        }
        match c {
            'b' if in_class => self.out.push_str(r"\x08"),
            'b' | 'B' | 'A' | 'z' if !in_class => {
                self.out.push('\\');
                self.out.push(c);
            }
            'a' | 'f' | 't' | 'n' | 'r' | 'v' => {
                self.out.push('\\');
                self.out.push(c);
            }
            'e' => self.out.push_str(r"\x1B"),
            'x' => self.hex()?,
            'u' => self.unicode(),
            '0' => {
                let mut value = 0;
                for _ in 0..2 {
                    match self.peek().and_then(|d| d.to_digit(8)) {
                        Some(digit) => {
                            value = value * 8 + digit;
                            self.at += 1;
                        }
                        None => break,
                    }
                }
                self.out.push_str(&format!("\\x{{{value:02X}}}"));
            }
            '1'..='9' if !in_class => {
                return Err(Unsupported(format!("a backreference (\\{c})")));
            }
            'k' => return Err(Unsupported("a backreference (\\k<...>)".to_string())),
            'g' => return Err(Unsupported("a subexpression call (\\g<...>)".to_string())),
            'Z' => {
                return Err(Unsupported(
                    "\\Z (end or before a final newline; $ or \\z match in linear time)"
                        .to_string(),
                ))
            }
            // Literals in Ruby; word boundaries in the regex crate.
            '<' | '>' => self.out.push(c),
            c if c.is_ascii_alphanumeric() => {
                return Err(Unsupported(format!("\\{c}")));
            }
            // Any other character escaped stands for itself.
            c => self
                .out
                .push_str(&regex::escape(c.encode_utf8(&mut [0; 4]))),
        }
        Ok(Item::Char)
    }

    /// After `\x`: one or two hex digits.
    fn hex(&mut self) -> Result<(), Unsupported> {
        let mut value = 0;
        let mut digits = 0;
        while digits < 2 {
            match self.peek().and_then(|d| d.to_digit(16)) {
                Some(digit) => {
                    value = value * 16 + digit;
                    digits += 1;
                    self.at += 1;
                }
                None => break,
            }
        }
        if digits == 0 {
            self.out.push_str(r"\x");
        } else if value >= 0x80 {
            return Err(Unsupported(format!(
                "\\x{value:02X} (a byte of a multibyte character; write the character or \\u{{...}})"
            )));
        } else {
            self.out.push_str(&format!("\\x{{{value:02X}}}"));
        }
        Ok(())
    }

    /// After `\u`: `\uHHHH` reads the same in both; `\u{...}` is copied
    /// whole (its `{` is not a repetition).
    fn unicode(&mut self) {
        self.out.push_str(r"\u");
        if self.peek() == Some('{') {
            while let Some(c) = self.next() {
                self.out.push(c);
                if c == '}' {
                    break;
                }
            }
        } else {
            for _ in 0..4 {
                match self.peek() {
                    Some(c) if c.is_ascii_hexdigit() => {
                        self.out.push(c);
                        self.at += 1;
                    }
                    _ => break,
                }
            }
        }
    }

    /// After `\p` or `\P`: a POSIX name (`\p{Alnum}`) as Onigmo reads it;
    /// any other property (a script, a category) as the regex crate does.
    /// Ruby writes a negation `\p{^Name}` too.
    fn property(&mut self, mut negated: bool) -> Item {
        if self.peek() != Some('{') {
            self.out.push_str(if negated { r"\P" } else { r"\p" });
            return Item::Set;
        }
        let Some(length) = self.chars[self.at..].iter().position(|&c| c == '}') else {
            self.out.push_str(if negated { r"\P" } else { r"\p" });
            return Item::Set;
        };
        let mut name: String = self.chars[self.at + 1..self.at + length].iter().collect();
        self.at += length + 1;
        if let Some(rest) = name.strip_prefix('^') {
            negated = !negated;
            name = rest.to_string();
        }
        let loose: String = name
            .chars()
            .filter(|c| !matches!(c, ' ' | '_' | '-'))
            .collect::<String>()
            .to_ascii_lowercase();
        match posix_items(&loose) {
            Some(items) => {
                self.out
                    .push_str(&format!("[{}{items}]", if negated { "^" } else { "" }));
            }
            None => {
                self.out
                    .push_str(&format!("\\{}{{{name}}}", if negated { 'P' } else { 'p' }));
            }
        }
        Item::Set
    }

    /// After `[`: the class up to its `]`, nested classes included.
    fn class(&mut self) -> Result<(), Unsupported> {
        let mut states = vec![self.open_class()];
        while let Some(c) = self.next() {
            let state = *states.last().expect("a class is open");
            let item = match c {
                ']' => {
                    self.out.push(']');
                    states.pop();
                    match states.last_mut() {
                        Some(outer) => *outer = ClassState::Open,
                        None => return Ok(()),
                    }
                    continue;
                }
                '[' => {
                    if !self.posix_bracket() {
                        states.push(self.open_class());
                        continue;
                    }
                    Item::Set
                }
                '\\' => self.escape(true)?,
                '&' if self.peek() == Some('&') => {
                    self.at += 1;
                    self.out.push_str("&&");
                    Item::Set
                }
                '-' if state == ClassState::AfterChar
                    && !matches!(self.peek(), None | Some(']')) =>
                {
                    self.out.push('-');
                    *states.last_mut().expect("a class is open") = ClassState::RangeEnd;
                    continue;
                }
                // Meta in the regex crate's classes only (`--`, `~~`, a
                // `&` before another): written as literals.
                '-' | '~' | '&' | '^' => {
                    self.out.push('\\');
                    self.out.push(c);
                    Item::Char
                }
                _ => {
                    self.out.push(c);
                    Item::Char
                }
            };
            *states.last_mut().expect("a class is open") =
                if item == Item::Char && state != ClassState::RangeEnd {
                    ClassState::AfterChar
                } else {
                    ClassState::Open
                };
        }
        // Unclosed: the regex crate reports it.
        Ok(())
    }

    /// Right after a class's `[`: writes it, with a leading `^`, and a `]`
    /// right there as the literal it is in Ruby.
    fn open_class(&mut self) -> ClassState {
        self.out.push('[');
        if self.peek() == Some('^') {
            self.at += 1;
            self.out.push('^');
        }
        if self.peek() == Some(']') {
            self.at += 1;
            self.out.push_str(r"\]");
            return ClassState::AfterChar;
        }
        ClassState::Open
    }

    /// After a `[` inside a class: a POSIX bracket (`[:alpha:]`,
    /// `[:^alpha:]`) is written out and true; anything else (a nested
    /// class) is left unread.
    fn posix_bracket(&mut self) -> bool {
        if self.peek() != Some(':') {
            return false;
        }
        let negated = self.peek_at(1) == Some('^');
        let start = self.at + 1 + usize::from(negated);
        let length = self.chars[start.min(self.chars.len())..]
            .iter()
            .take_while(|c| c.is_ascii_lowercase())
            .count();
        let end = start + length;
        if self.chars.get(end) != Some(&':') || self.chars.get(end + 1) != Some(&']') {
            return false;
        }
        let name: String = self.chars[start..end].iter().collect();
        let Some(items) = posix_items(&name) else {
            return false;
        };
        self.out
            .push_str(&format!("[{}{items}]", if negated { "^" } else { "" }));
        self.at = end + 2;
        true
    }

    /// After `(`.
    fn group(&mut self) -> Result<(), Unsupported> {
        if self.peek() != Some('?') {
            self.groups.push(self.extended);
            self.out.push('(');
            return Ok(());
        }
        self.at += 1;
        match (self.peek(), self.peek_at(1)) {
            (Some('#'), _) => {
                // A comment, up to the first unescaped `)`.
                while let Some(c) = self.next() {
                    match c {
                        '\\' => self.at += 1,
                        ')' => break,
                        _ => {}
                    }
                }
                Ok(())
            }
            (Some('='), _) | (Some('!'), _) => {
                Err(Unsupported("look-ahead ((?= or (?!)".to_string()))
            }
            (Some('<'), Some('=')) | (Some('<'), Some('!')) => {
                Err(Unsupported("look-behind ((?<= or (?<!)".to_string()))
            }
            (Some('>'), _) => Err(Unsupported("an atomic group ((?>...))".to_string())),
            (Some('~'), _) => Err(Unsupported("an absence operator ((?~...))".to_string())),
            (Some('('), _) => Err(Unsupported("a conditional ((?(...)...))".to_string())),
            (Some('<'), _) => {
                // A named group: its `<name>` reads the same.
                self.groups.push(self.extended);
                self.out.push_str("(?");
                Ok(())
            }
            (Some('\''), _) => {
                self.at += 1;
                self.groups.push(self.extended);
                self.out.push_str("(?<");
                while let Some(c) = self.next() {
                    if c == '\'' {
                        break;
                    }
                    self.out.push(c);
                }
                self.out.push('>');
                Ok(())
            }
            _ => self.options_group(),
        }
    }

    /// After `(?`: options, `(?i-m)` (to the end of the enclosing group) or
    /// `(?i-m:...)`; `(?:...)` has none.
    fn options_group(&mut self) -> Result<(), Unsupported> {
        let mut on = String::new();
        let mut off = String::new();
        let mut extended = self.extended;
        let mut negative = false;
        let start = self.at;
        let terminator = loop {
            match self.next() {
                Some('-') => negative = true,
                Some(c @ ('i' | 'm' | 'x')) => {
                    let flag = match c {
                        'x' => {
                            extended = !negative;
                            continue;
                        }
                        'm' => 's',
                        _ => 'i',
                    };
                    if negative { &mut off } else { &mut on }.push(flag);
                }
                Some(c @ (':' | ')')) => break c,
                Some(c) if c.is_ascii_alphabetic() => {
                    return Err(Unsupported(format!("the option (?{c})")));
                }
                _ => {
                    // Not options: the regex crate reports it.
                    self.out.push_str("(?");
                    self.at = start;
                    return Ok(());
                }
            }
        };
        let flags = if off.is_empty() {
            on
        } else {
            format!("{on}-{off}")
        };
        if terminator == ':' {
            self.groups.push(self.extended);
            self.out.push_str(&format!("(?{flags}:"));
        } else if !flags.is_empty() {
            self.out.push_str(&format!("(?{flags})"));
        }
        self.extended = extended;
        Ok(())
    }

    /// After `{`: a repetition (`{n}`, `{n,}`, `{,m}`, `{n,m}`), or else
    /// a literal `{`, as in Ruby.
    fn interval(&mut self) {
        let rest = &self.chars[self.at..];
        let digits = |from: usize| {
            rest[from.min(rest.len())..]
                .iter()
                .take_while(|c| c.is_ascii_digit())
                .count()
        };
        let low = digits(0);
        let (high, length) = if rest.get(low) == Some(&',') {
            let high = digits(low + 1);
            (Some(high), low + 1 + high)
        } else {
            (None, low)
        };
        let valid = rest.get(length) == Some(&'}') && (low > 0 || high.is_some_and(|h| h > 0));
        if !valid {
            self.out.push_str(r"\{");
            return;
        }
        let low_text: String = rest[..low].iter().collect();
        let low_text = if low_text.is_empty() {
            "0".to_string()
        } else {
            low_text
        };
        let text = match high {
            None => format!("{{{low_text}}}"),
            Some(high) => {
                let high_text: String = rest[low + 1..low + 1 + high].iter().collect();
                format!("{{{low_text},{high_text}}}")
            }
        };
        self.out.push_str(&text);
        self.at += length + 1;
    }
}
