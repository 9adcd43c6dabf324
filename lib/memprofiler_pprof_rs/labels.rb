# frozen_string_literal: true

module MemprofilerPprof
  # Context labels: which request or job the code is running for. Every
  # sample taken while a set of labels is current carries it, in the
  # allocation profile and, for as long as the object lives, in the live
  # (inuse_*) profile, so `go tool pprof -tagfocus endpoint=...` and
  # `memprofiler_pprof_rs top --by endpoint` say whose objects are alive.
  #
  #   MemprofilerPprof.with_labels(endpoint: "GET /users/:id") { ... }
  #
  # Labels belong to the current fiber (a Rack request, a job), as
  # `Thread.current[]` values do: a thread or fiber the request starts
  # begins without them; pass them on with
  # `MemprofilerPprof.with_labels(**parent_labels) { ... }`.
  #
  # Setting them costs a hash lookup per call and nothing per allocation:
  # the allocation hook reads the fiber's set only when it takes a sample,
  # and stores a number with the sample, never a Ruby object.
  #
  # Bounds: keys are identifiers (letters, digits, _) of at most 64
  # characters, "class" and "gc_age" are the profile's own; at most 8
  # labels a set; values are cut to 200 bytes. Beyond max_label_sets
  # distinct sets in the process (1,000 unless set), a new set's values read
  # "(other)" (Labels.folds counts them), so labelling by request id costs
  # a bounded table, not unbounded memory.
  module Labels
    # Native: _intern, _labels, max_sets, _set_max_sets, folds, count and
    # FIBER_KEY (src/ruby/labels.rs).

    VALUE_KINDS = "a String, Symbol, number, true, false, Module or nil"
    MAX_LABELS = 8
    # Entries a Hash given may have (nil values remove labels).
    MAX_GIVEN = 64
    EMPTY = {}.freeze
    private_constant :VALUE_KINDS, :EMPTY, :MAX_GIVEN

    class << self
      # The current fiber's labels, as a frozen Hash of Strings.
      def current
        pairs = _labels(Thread.current[FIBER_KEY])
        pairs ? pairs.to_h.freeze : EMPTY
      end

      # Makes `labels` (a Hash; nil or {} for none) the current fiber's
      # whole set. Returns it as current shows it.
      def replace(labels)
        Thread.current[FIBER_KEY] = intern(pairs(labels, "labels"))
        current
      end

      # Runs the block with `labels` added to (or, per key, replacing) the
      # current fiber's; a nil value removes that key. Restores the set
      # before the block was run, however the block ends.
      def with(labels, &block)
        raise ArgumentError, "with_labels needs a block" unless block

        with_id(id_for(labels), &block)
      end

      # Runs the block with `labels` added, or without them if they cannot
      # be (a ninth label): for the gem's own integrations, which must never
      # raise into the request or job they label.
      def with_if_valid(labels, &block)
        id = begin
          id_for(labels)
        rescue ArgumentError, TypeError
          return yield
        end
        with_id(id, &block)
      end

      # The id of the current fiber's labels with `labels` merged in (nil
      # for none); raises on bad labels, changing nothing.
      def id_for(labels)
        merged = current.merge(pairs(labels, "labels").to_h)
        merged.delete_if { |_, value| value.nil? }
        intern(merged.to_a)
      end

      # Runs the block with the set `id` (from id_for) current.
      def with_id(id)
        key = FIBER_KEY
        before = Thread.current[key]
        begin
          Thread.current[key] = id
          yield
        ensure
          Thread.current[key] = before
        end
      end

      def max_sets=(count)
        Validation.integer(count, "max_label_sets", min: 1, max: 50_000)
        _set_max_sets(count)
      end

      private

      # The set's id, or nil for no labels (keeps the fiber's table clean).
      def intern(pairs)
        id = _intern(pairs.reject { |_, value| value.nil? })
        id.zero? ? nil : id
      end

      # [[key, value], ...] as UTF-8 Strings (value nil: no such label).
      def pairs(labels, name)
        return [] if labels.nil?

        Validation.type_error!(name, "a Hash of label => value", labels) unless labels.is_a?(Hash)
        # (Checked again once merged; this bounds the work on a huge Hash.)
        raise ArgumentError, "#{labels.size} labels: at most #{MAX_LABELS} in one set" if labels.size > MAX_GIVEN

        pairs = labels.map { |key, value| [label_key(key), label_value(key, value)] }
        twice = pairs.map(&:first).tally.find { |_, count| count > 1 }
        raise ArgumentError, "label key #{twice.first.inspect} given twice (as a String and a Symbol)" if twice

        pairs
      end

      def label_key(key)
        case key
        when Symbol then utf8(key.name)
        when String then utf8(key)
        else Validation.type_error!("a label key", "a Symbol or String", key)
        end
      end

      def label_value(key, value)
        case value
        when nil then nil
        when String then utf8(value)
        when Symbol, Numeric, true, false then utf8(value.to_s)
        when Module then value.name ? utf8(value.name) : "(anonymous #{value.class.name.downcase})"
        else Validation.type_error!("label #{key}", VALUE_KINDS, value)
        end
      end

      # UTF-8 for the native side, which reads bytes without converting
      # (binary and invalid bytes read as U+FFFD there).
      def utf8(string)
        case string.encoding
        when Encoding::UTF_8, Encoding::US_ASCII, Encoding::BINARY then string
        else string.encode(Encoding::UTF_8, invalid: :replace, undef: :replace)
        end
      end
    end
  end

  class << self
    # Runs the block with these labels on every sample it allocates
    # (see Labels).
    def with_labels(labels = nil, **keywords, &block)
      Validation.type_error!("labels", "a Hash of label => value", labels) unless labels.nil? || labels.is_a?(Hash)
      Labels.with(labels ? labels.merge(keywords) : keywords, &block)
    end

    # The current fiber's labels (a frozen Hash of Strings).
    def labels
      Labels.current
    end

    # Replaces the current fiber's labels (nil or {} clears them).
    def labels=(labels)
      Labels.replace(labels)
    end

    # Distinct label sets kept before new ones fold into "(other)".
    def max_label_sets
      Labels.max_sets
    end

    def max_label_sets=(count)
      Labels.max_sets = count
    end
  end
end
