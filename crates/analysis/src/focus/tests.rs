use super::ruby_syntax::translate;
use super::*;
use crate::decoded_profile::tests::profile_from;

fn pattern(source: &str, options: RubyOptions) -> FocusPattern {
    FocusPattern::new(source.as_bytes(), options)
        .unwrap_or_else(|error| panic!("{source:?}: {error}"))
}

fn matches(source: &str, text: &str) -> bool {
    pattern(source, RubyOptions::default()).is_match(text)
}

fn error(source: &str) -> FocusError {
    FocusPattern::new(source.as_bytes(), RubyOptions::default()).expect_err(source)
}

#[test]
fn regexp_options_bits_map_to_flags() {
    assert_eq!(RubyOptions::from_bits(0), RubyOptions::default());
    // FIXEDENCODING (16) and NOENCODING (32) do not change what matches.
    assert_eq!(RubyOptions::from_bits(16 | 32), RubyOptions::default());
    let all = RubyOptions::from_bits(1 | 2 | 4);
    assert!(all.ignore_case && all.extended && all.dot_all);
    let multiline = RubyOptions::from_bits(RubyOptions::MULTILINE);
    assert_eq!(
        multiline,
        RubyOptions {
            dot_all: true,
            ..RubyOptions::default()
        }
    );
}

#[test]
fn ruby_m_is_dot_all_and_anchors_are_always_per_line() {
    let dot_all = RubyOptions {
        dot_all: true,
        ..RubyOptions::default()
    };
    assert!(!matches("a.b", "a\nb"));
    assert!(pattern("a.b", dot_all).is_match("a\nb"));
    // Ruby's inline m is dot-all too, not the regex crate's line anchors.
    assert!(matches("(?m)a.b", "a\nb"));
    assert!(matches("(?m:a.b)", "a\nb"));
    assert!(!matches("(?m:a).b", "a\nb"));
    assert!(!matches("(?m)(?-m)a.b", "a\nb"));
    // ^ and $ at each line, with or without m; \A and \z at the ends.
    assert!(matches("^save$", "Order#run\nsave\nx"));
    assert!(!matches(r"\Asave\z", "Order#run\nsave\nx"));
    assert!(matches(r"\Asave\z", "save"));
    let ignore_case = RubyOptions {
        ignore_case: true,
        ..RubyOptions::default()
    };
    assert!(pattern("order#save", ignore_case).is_match("ORDER#Save"));
    assert!(!matches("order#save", "ORDER#Save"));
    assert!(matches("(?i:order)#save", "ORDER#save"));
    assert!(!matches("(?i:order)#save", "ORDER#SAVE"));
}

#[test]
fn extended_ignores_whitespace_and_comments_outside_classes_only() {
    let extended = RubyOptions {
        extended: true,
        ..RubyOptions::default()
    };
    let spaced = pattern("Order \\# save  # the method\n | x y", extended);
    assert!(spaced.is_match("Order#save"));
    assert!(spaced.is_match("xy"));
    assert!(!spaced.is_match("Order #save"));
    // Inside [...] Ruby keeps the space and the #.
    let class = pattern("[ #]a", extended);
    assert!(class.is_match(" a") && class.is_match("#a"));
    assert!(matches("(?x) a b (?-x) c", "ab c"));
    assert!(matches("(?x: a b ) c", "ab c"));
    assert!(!matches("(?x: a b ) c", "abc"));
}

#[test]
fn ascii_shorthands_and_unicode_posix_classes_as_in_ruby() {
    // \d \w \s are ASCII in Ruby; \h is a hex digit.
    assert!(!matches(r"\d", "٣"));
    assert!(!matches(r"\w", "é"));
    assert!(matches(r"\W", "é"));
    assert!(matches(r"\s", "\x0B"));
    assert!(!matches(r"\s", "\u{a0}"));
    assert!(matches(r"\A\h+\z", "c0ffee"));
    assert!(!matches(r"\h", "g"));
    assert!(matches(r"\A\H\z", "g"));
    assert!(matches(r"\A[\h_]+\z", "dead_beef"));
    // POSIX brackets and properties are Unicode.
    assert!(matches(r"\A[[:alpha:]]+\z", "café"));
    assert!(matches(r"[[:digit:]]", "٣"));
    assert!(matches(r"[[:punct:]]", "$"));
    assert!(!matches(r"\A[[:^alpha:]]\z", "é"));
    assert!(matches(r"\A\p{Alnum}+\z", "café9"));
    assert!(matches(r"\A\p{^Alpha}\z", "9"));
    assert!(matches(r"\p{Greek}", "λ"));
    // \b is Unicode in Ruby too.
    assert!(matches(r"\bé", "é"));
    assert!(!matches(r"a\b", "aé"));
}

#[test]
fn what_ruby_reads_as_literals() {
    assert!(matches("{foo}", "x{foo}"));
    assert!(matches("a{", "a{"));
    assert!(matches(r"a{x}", "a{x}"));
    assert!(matches(r"\A\<init\>\z", "<init>"));
    assert!(matches(r"\Aa{,2}b\z", "aab"));
    assert!(!matches(r"\Aa{,2}b\z", "aaab"));
    assert!(matches(r"\Aa{2,}\z", "aaa"));
    assert!(matches(r"\A(?:a{2})+\z", "aaaa"));
    assert!(matches(r"\Aa{2}+\z", "aaaa"));
    assert!(!matches(r"\Aa{2}+\z", "aaa"));
    assert!(matches("a]", "a]"));
    // Classes: a leading ] and -, ranges ending in -, no -- or ~~ operators.
    assert!(matches(r"\A[]a]\z", "]"));
    assert!(matches(r"\A[+--]\z", ","));
    assert!(matches(r"\A[--a]\z", "0"));
    assert!(matches(r"\A[a-]\z", "-"));
    assert!(matches(r"\A[a~~]\z", "~"));
    assert!(matches(r"\A[a&b]\z", "&"));
    assert!(matches(r"\A[a-z&&[^aeiou]]\z", "b"));
    assert!(!matches(r"\A[a-z&&[^aeiou]]\z", "a"));
    assert!(matches(r"\A[:alpha:]+\z", ":ha"));
    assert!(!matches(r"\A[:alpha:]\z", "b"));
    assert!(matches(r"\x41\u0042\u{43}\e\0", "ABC\x1b\0"));
    assert!(matches(r"\A[\x41-\x43]+\z", "ABC"));
    assert!(matches("(?#a comment)Order", "Order"));
    assert!(matches("(?'name'Order)#(?<verb>save)", "Order#save"));
}

#[test]
fn translation_writes_out_what_reads_differently() {
    assert_eq!(translate(r"\d\h", false).unwrap(), "[0-9][0-9A-Fa-f]");
    assert_eq!(translate(r"[\w-]", false).unwrap(), r"[[0-9A-Za-z_]\-]");
    assert_eq!(translate("(?mi-x:a)", false).unwrap(), "(?si:a)");
    assert_eq!(translate("(?x)a b", false).unwrap(), "ab");
    assert_eq!(translate("{,3}{2}{", false).unwrap(), r"{0,3}{2}\{");
    assert_eq!(translate(r"\<", false).unwrap(), "<");
    assert_eq!(translate(r"[a--]", false).unwrap(), r"[a-\-]");
}

#[test]
fn refuses_what_has_no_linear_time_match() {
    for (source, what) in [
        (r"(Order)#\1", "a backreference (\\1)"),
        (r"(?<o>Order)\k<o>", "a backreference (\\k<...>)"),
        (r"(?<o>a)\g<o>", "a subexpression call"),
        ("Order(?=#save)", "look-ahead"),
        ("Order(?!#save)", "look-ahead"),
        ("(?<=Order)#save", "look-behind"),
        ("(?<!Order)#save", "look-behind"),
        ("(?>Order)", "an atomic group"),
        ("a*+", "a possessive quantifier"),
        ("a++", "a possessive quantifier"),
        ("a?+", "a possessive quantifier"),
        ("(?~abc)", "an absence operator"),
        ("(a)(?(1)b|c)", "a conditional"),
        (r"save\Z", "\\Z"),
        (r"\xC3\xA9", "\\xC3"),
        (r"\Gsave", "\\G"),
        (r"[\1]", "\\1"),
        ("(?a)save", "the option (?a)"),
    ] {
        match error(source) {
            FocusError::Unsupported(said) => {
                assert!(said.starts_with(what), "{source}: {said}")
            }
            other => panic!("{source}: {other:?}"),
        }
    }
    let message = error(r"(a)\1").to_string();
    assert!(
        message.starts_with(
            "uses a backreference (\\1), which the linear-time matcher does not support"
        ),
        "{message}"
    );
    // Not backtracking: a lazy quantifier is fine.
    assert!(matches("a*?b", "aab"));
    assert!(matches(r"\Aa??b\z", "ab"));
}

#[test]
fn refuses_huge_patterns_and_bytes_that_are_not_utf8() {
    assert_eq!(error("a{100000}{100000}"), FocusError::TooBig);
    assert!(error("a{100000}{100000}").to_string().contains("10 MB"));
    let alternation: String = (0..100_000).map(|i| format!("Class{i}|")).collect();
    assert_eq!(error(&alternation), FocusError::TooLong(alternation.len()));
    let just_fits: String = alternation[..MAX_PATTERN_BYTES - 1].to_string() + "x";
    assert!(FocusPattern::new(just_fits.as_bytes(), RubyOptions::default()).is_ok());
    assert_eq!(
        FocusPattern::new(b"Order\xff", RubyOptions::default()).unwrap_err(),
        FocusError::NotUtf8
    );
    assert!(matches!(
        error(r"\p{NoSuchProperty}"),
        FocusError::Rejected(why) if why.contains("property")
    ));
}

#[test]
fn matching_frames_by_name_or_file_once_per_string() {
    let raw = profile_from(
        &[("inuse_space", "bytes")],
        &[
            (
                &[
                    ("Order#save", "/app/order.rb", 3),
                    ("Job#run", "/app/job.rb", 9),
                ],
                &[10],
                None,
            ),
            (
                &[
                    ("Cart#add", "/app/orders/cart.rb", 5),
                    ("Job#run", "/app/job.rb", 9),
                ],
                &[20],
                None,
            ),
        ],
    );
    let profile = DecodedProfile::from_raw(raw).unwrap();
    let names = |frames: Vec<u32>| -> Vec<String> {
        frames
            .iter()
            .map(|&f| profile.string(profile.frames[f as usize].name).to_string())
            .collect()
    };
    let order = pattern("order", RubyOptions::from_bits(RubyOptions::IGNORECASE));
    assert_eq!(
        names(order.matching_frames(&profile)),
        ["Order#save", "Cart#add"]
    );
    assert_eq!(
        names(pattern(r"\AJob#", RubyOptions::default()).matching_frames(&profile)),
        ["Job#run"]
    );
    assert!(pattern("nothing", RubyOptions::default())
        .matching_frames(&profile)
        .is_empty());
}

/// The issue: Ruby's Regexp took minutes (quadratic backtracking) on this.
/// No time is asserted; it finishes at once.
#[test]
fn a_million_character_name_is_matched_in_linear_time() {
    let name = "Order".repeat(200_000);
    let focus = pattern("Order.*save", RubyOptions::default());
    assert!(!focus.is_match(&name));
    assert!(focus.is_match(&format!("{name}#save")));
}
