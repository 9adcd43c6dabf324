# frozen_string_literal: true

# `top --focus` and Profile#top(focus:) on untrusted profiles (issue 36,
# item 3). Ruby's Regexp backtracks: /Order.*save/ over one name of
# 1,000,000 characters (a 1.6 KB profile) did not finish in a minute, with
# the GVL held. The pattern is now matched in Rust in linear time
# (crates/analysis/src/focus), in Ruby's syntax: these check that it answers what
# Ruby's Regexp answers, and refuses what it cannot do, saying why.
RSpec.describe "focus" do
  exe = File.join(PROJECT_ROOT, "exe/memprofiler_pprof_rs")
  types = [%w[inuse_space bytes]]

  include_context "in a temporary directory"

  def cli(exe, *args)
    out, err, status = Open3.capture3(RbConfig.ruby, exe, *args, chdir: @dir)
    [out, err, status.exitstatus]
  end

  # A profile with a sample of 1 byte per name, each at its own line
  # (its position + 1) of f.rb.
  def one_sample_per_name(types, names, file: "f.rb")
    samples = names.each_with_index.map { |name, i| { stack: [[name, file, i + 1, 1]], values: [1] } }
    MemprofilerPprof::Profile.parse(PprofWriter.build(sample_types: types, samples: samples))
  end

  # The positions of the names whose sample `top` counts with `focus`.
  def focused(profile, focus)
    profile.top(by: :line, limit: 0, focus: focus).scan(/ f\.rb:(\d+)$/).map { |(line)| line.to_i - 1 }.sort
  end

  # Patterns whose Ruby warnings ("character class has ']' without escape")
  # are the point.
  def quietly
    verbose = $VERBOSE
    $VERBOSE = nil
    yield
  ensure
    $VERBOSE = verbose
  end

  describe "on a 1,000,000-character name" do
    it "finishes, in top(focus:) and in the CLI's --focus (Ruby's Regexp took minutes)" do
      huge = "Order" * 200_000
      samples = [{ stack: [[huge, "/app/order.rb", 3, 1]], values: [100] },
                 { stack: [["Order#save", "/app/order.rb", 9, 8], ["Job#run", "/app/job.rb", 2, 1]], values: [50] }]
      bytes = PprofWriter.build(sample_types: types, samples: samples)
      expect(bytes.bytesize).to be < 2_000
      File.binwrite(File.join(@dir, "huge.pprof"), bytes)

      report = MemprofilerPprof::Profile.parse(bytes).top(focus: /Order.*save/)
      expect(report).to include("Focus: /Order.*save/ matches 50 B of 150 B (33.3%)")
      out, err, status = cli(exe, "top", "huge.pprof", "--focus", "Order.*save")
      expect(status).to eq(0), err
      expect(out).to include("Focus: /Order.*save/ matches 50 B of 150 B (33.3%)", "Job#run")
    end
  end

  describe "Ruby's syntax" do
    names = ["Order#save", "Order#run", "OrderOrder#save", "order#SAVE", "ORDER#save", "Cart#add", "café", "a\nb",
             "a b", "ab", "aab", "aaab", "aaa", "aaaa", "٣", "λ", "9", "dead_beef", "c0ffee", "<init>", "{foo}",
             "a{", "]", ",", "-", "0", "~", "&", ":ha", "x\ty", "\u00a0", "\v", "#x", " x", "A", "ABC", "é", "aé",
             "\e", "block in <main>", "Hash#[]", "Kernel#require", "$stdout", "K", "\u212a", "É", "Ä", "ä"]
    # [source, options]: each a place where Ruby's and the regex crate's
    # syntaxes differ, or an ordinary pattern. (Not /[[:upper:]]/i: Ruby
    # case-folds no non-ASCII range or property, /[À-Þ]/i misses "é"; the
    # regex crate does.)
    patterns = [
      ["Order"], ["order", Regexp::IGNORECASE], ["Order.*save"], ['\AOrder#save\z'], ["^b$"], ["a$"], ["a.b"],
      ["a.b", Regexp::MULTILINE], ["(?m)a.b"], ["(?m:a).b"], ["(?i:ORDER)#save"], ["(?i)k"], ['\d'], ['\w+é'],
      ['\A\w+\z'], ['\s'], ['\A\h{4}'], ['\A\H'], ['\bé'], ['a\b'], ['\W'], ['\S'], ['\A\D'],
      ["[[:alpha:]]{4}"], ["[[:digit:]]"], ["[[:punct:]]"], ['\A[[:^alpha:]]+\z'], ['\A\p{Alnum}+\z'],
      ['\A\p{^Alpha}+\z'], ["[[:space:]]"], ["[[:upper:]]"], ['\A[[:xdigit:]]+\z'], ['\A[[:word:]]+\z'],
      ['\p{Greek}'], ["[[:blank:]]"], ["[[:cntrl:]]"], ['\A[[:graph:]]+\z'], ['\A[[:print:]]+\z'],
      ["{foo}"], ["a{"], ['\Aa{,2}b\z'], ['\Aa{2,}\z'], ['\Aa{2}+\z'], ['\<init\>'], ["[]a]"], ['\A[+--]\z'],
      ['\A[--a]\z'], ['\A[a-]\z'], ['\A[a-z&&[^aeiou]]{3}'], ['\A[:alpha:]+\z'], ['[\w-]{4}'], ['[\h_]{9}'],
      ["O r d e r # a comment\n ", Regexp::EXTENDED], ["[ #]x", Regexp::EXTENDED], ["(?x) a b"], ["(?x: a b ) "],
      ["(?#a comment)Order"], ["(?<verb>save)"], ["(?'n'Order)"], ['\x41'], ['\u00e9'], ['\u{e9}'], ['\e'],
      ['\Aa??b\z'], ["a*?b"], ["(?:a|b)+c"], [""], ['\n'], ['\t'], ['\v'], ['\]'], ['\A\$'], ["[~&]"],
      ['\A[\[\]]'], ["Hash#\\[\\]"], ["(?i)Ä|k"], ['\A\p{Lu}'], ['[^\W\d]{3}'], ['\A[^[:alpha:][:digit:]]+\z'],
      ["\\Aé\\z", Regexp::IGNORECASE]
    ]

    it "matches what Ruby's Regexp matches" do
      # The file is "", which few patterns match: the names decide. Frames
      # are numbered in the order of the samples (one each).
      profile = one_sample_per_name(types, names, file: "")
      frames = ->(regexp) { profile.send(:focus_for, regexp).first }
      expect(names.map { |name| frames.call(/\A#{Regexp.escape(name)}\z/) }).to eq(names.each_index.map { |i| [i] })
      quietly do
        patterns.each do |source, options|
          regexp = Regexp.new(source, options)
          expected = names.each_index.select { |i| regexp.match?(names[i]) || regexp.match?("") }
          expect(frames.call(regexp)).to eq(expected), "#{regexp.inspect}: #{frames.call(regexp).map { |i| names[i] }} " \
                                                       "instead of #{expected.map { |i| names[i] }}"
        end
        expect(patterns.map { |source, options| frames.call(Regexp.new(source, options)).size }.uniq.size).to be > 10
      end
    end

    it "takes a String as Ruby's Regexp.new does, shown as that Regexp" do
      profile = one_sample_per_name(types, names)
      expect(focused(profile, "Order#")).to eq(focused(profile, /Order#/))
      expect(profile.top(focus: "Order#")).to eq(profile.top(focus: /Order#/))
      expect(profile.top(focus: "Order#")).to include("Focus: /Order#/ matches 3 B of")
      expect(focused(profile, /order#save/i).map { |i| names[i] })
        .to eq(["Order#save", "OrderOrder#save", "order#SAVE", "ORDER#save"])
      expect(focused(profile, /\ACart#add\z/).map { |i| names[i] }).to eq(["Cart#add"])
      expect(focused(profile, /\Aadd/)).to be_empty
      expect(profile.top(focus: /ORDER/i)).to include("Focus: /ORDER/i matches")
    end
  end

  describe "patterns the linear-time matcher cannot take" do
    it "refuses a backreference, look-around and the like, naming the pattern and saying why" do
      profile = one_sample_per_name(types, ["Order#save"])
      [
        [/(Order)#\1/, "a backreference (\\1)"],
        [/(?<o>Order)\k<o>/, "a backreference (\\k<...>)"],
        ["Order(?=#save)", "look-ahead ((?= or (?!)"],
        ["(?<!Job)#save", "look-behind ((?<= or (?<!)"],
        [/(?>Order)/, "an atomic group ((?>...))"],
        [/Order#s*+ave/, "a possessive quantifier (*+, ++ or ?+)"],
        [/save\Z/, "\\Z (end or before a final newline; $ or \\z match in linear time)"],
        [/\Gsave/, "\\G"]
      ].each do |focus, what|
        shown = focus.is_a?(Regexp) ? focus.inspect : Regexp.new(focus).inspect
        expect { profile.top(focus: focus) }.to raise_error(
          ArgumentError,
          "focus #{shown} uses #{what}, which the linear-time matcher does not support " \
          "(focus never backtracks, so that no profile can make it hang)"
        )
      end
      expect { MemprofilerPprof::Profile.focus_regexp(/(a)\1/) }.to raise_error(ArgumentError, /backreference/)
      expect(MemprofilerPprof::Profile.focus_regexp("Order#")).to eq(/Order#/)
    end

    it "refuses an invalid pattern, and one that is not UTF-8, with ArgumentError" do
      profile = one_sample_per_name(types, ["Order#save"])
      expect { profile.top(focus: "(") }
        .to raise_error(ArgumentError, /\Afocus "\(" is not a valid regular expression: end pattern with unmatched/)
      expect { profile.top(focus: "Order\xff") }.to raise_error(ArgumentError, /not a valid regular expression/)
      expect { profile.top(focus: Regexp.new("\xff".b)) }
        .to raise_error(ArgumentError, "focus /\\xFF/ is not valid UTF-8")
      expect { profile.top(focus: /\p{In_Arrows}/) }
        .to raise_error(ArgumentError, %r{\Afocus /\\p\{In_Arrows\}/ is not supported by the linear-time matcher: })
      expect { profile.top(focus: 42) }.to raise_error(TypeError, "focus must be a Regexp or String, got 42")
      # Not UTF-8 but convertible: read as the same characters.
      expect(focused(one_sample_per_name(types, ["café"]), Regexp.new("é".encode("EUC-JP")))).to eq([0])
    end

    it "refuses huge patterns before they take memory, with a short message" do
      profile = one_sample_per_name(types, ["Order#save"])
      expect { profile.top(focus: "a{100000}{100000}") }
        .to raise_error(ArgumentError, "focus /a{100000}{100000}/ is too big: compiled, it would take more " \
                                       "than 10 MB (focus's limit)")
      alternation = (1..100_000).map { |i| "Class#{i}" }.join("|")
      expect(alternation.bytesize).to be > 1_000_000
      expect { profile.top(focus: alternation) }.to raise_error(ArgumentError) { |error|
        expect(error.message).to start_with("focus /Class1|Class2|")
        expect(error.message).to end_with("... is 1088894 bytes long; focus takes patterns of at most 16384 bytes")
        expect(error.message.size).to be < 400
      }
    end

    it "is a usage mistake (exit 2) in the CLI, found before the profile is read" do
      File.binwrite(File.join(@dir, "a.pprof"), PprofWriter.build(sample_types: types, samples: []))
      [
        ['(Order)#\1', "--focus /(Order)#\\1/ uses a backreference (\\1), which the linear-time matcher"],
        ["a{100000}{100000}", "--focus /a{100000}{100000}/ is too big"],
        ["(", "--focus \"(\" is not a valid regular expression"]
      ].each do |focus, message|
        %w[a.pprof missing.pprof].each do |file|
          _out, err, status = cli(exe, "top", file, "--focus", focus)
          expect(status).to eq(2), err
          expect(err.lines.first).to start_with("memprofiler_pprof_rs: #{message}")
        end
      end
    end
  end
end
