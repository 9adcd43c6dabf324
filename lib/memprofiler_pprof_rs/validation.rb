# frozen_string_literal: true

module MemprofilerPprof
  # The one place where arguments of the gem's public API are checked.
  #
  # The rule (Ruby's own: Integer(nil) is a TypeError, Integer("x") an
  # ArgumentError; [].first("1") a TypeError, [].first(-1) an ArgumentError):
  #
  # * TypeError: the value is not the kind of object asked for: another
  #   class (a String where a number goes, nil where a value is required,
  #   a Symbol where true/false goes), or an object without the method the
  #   gem will call on it (a logger without #error, an on_flush without
  #   #call).
  # * ArgumentError: the kind is right but the value is not usable: out of
  #   range (negative, NaN, too large), empty, malformed (a bad URL, file
  #   pattern, label name, IP range), or not one of a fixed set of choices
  #   (bt_method: :nope; a choice is a value, so even bt_method: "cfp" is an
  #   ArgumentError).
  #
  # Every message names the argument and shows the value it got (secrets,
  # such as a token, are described, never shown). The native extension
  # follows the same rule for the counts it is passed
  # (count_arg in src/ruby/convert.rs).
  module Validation
    # Longest inspect shown in a message.
    MAX_SHOWN = 200

    module_function

    # The value as a message shows it.
    def show(value)
      text = value.inspect
      text.size > MAX_SHOWN ? "#{text[0, MAX_SHOWN]}..." : text
    rescue StandardError
      "#<#{value.class}>"
    end

    def type_error!(name, expected, value)
      raise TypeError, "#{name} must be #{expected}, got #{show(value)}"
    end

    def value_error!(name, expected, value)
      raise ArgumentError, "#{name} must be #{expected}, got #{show(value)}"
    end

    # true or false, nothing else (not nil, not 1, not "yes").
    def flag(value, name)
      # (Not [true, false].include?: a valid value allocates nothing.)
      return value if value == true || value == false # rubocop:disable Style/MultipleComparison

      type_error!(name, "true or false", value)
    end

    # An Integer in min..max (either end optional); nil too with nil_ok.
    def integer(value, name, min: nil, max: nil, nil_ok: false, expected: nil)
      return value if nil_ok && value.nil?

      # (The description is built only for a message: a valid value
      # allocates nothing, as a flush's own checks must not.)
      type_error!(name, expected || integer_description(min, max, nil_ok), value) unless value.is_a?(Integer)
      value_error!(name, expected || integer_description(min, max, nil_ok), value) if (min && value < min) || (max && value > max)
      value
    end

    def integer_description(min, max, nil_ok)
      text = if min && max
               "an Integer from #{min} to #{max}"
             elsif min == 1
               "a positive Integer"
             elsif min
               "an Integer >= #{min}"
             elsif max
               "an Integer <= #{max}"
             else
               "an Integer"
             end
      nil_ok ? "#{text} or nil" : text
    end

    # A real, finite number (Integer, Float, Rational, BigDecimal...) that is
    # >= 0, or > 0 with positive: true; returned as a Float. Objects that
    # merely respond to to_f are refused, as Ruby's own Float arguments
    # refuse them.
    def seconds(value, name, positive: true, expected: nil)
      expected ||= positive ? "a positive number of seconds" : "a number of seconds >= 0"
      type_error!(name, expected, value) unless value.is_a?(Numeric) && value.real?
      float = value.to_f
      usable = float.finite? && (positive ? value.positive? : !value.negative?)
      value_error!(name, expected, value) unless usable
      float
    end

    # A real number from 0.0 to 1.0, as a Float (-0.0 becomes 0.0).
    def fraction(value, name)
      float = value.to_f if value.is_a?(Numeric) && value.real?
      type_error!(name, "a Float between 0.0 and 1.0", value) unless float.is_a?(Float)
      value_error!(name, "between 0.0 and 1.0", value) unless float.finite? && float >= 0.0 && float <= 1.0

      float + 0.0
    end

    # One of `choices` (compared with ==); anything else is a bad value.
    # `listed`: how the message lists them (default: choices.inspect).
    def one_of(value, choices, name, listed: choices.inspect)
      return value if choices.include?(value)

      value_error!(name, "one of #{listed}", value)
    end

    # An object that responds to `method` (nil too with nil_ok).
    def responds_to(value, method, name, nil_ok: false, hint: nil)
      return value if (nil_ok && value.nil?) || value.respond_to?(method)

      raise TypeError, "#{name} must respond to ##{method}#{" (#{hint})" if hint}, got #{show(value)}"
    end

    # An instance of one of `classes` (nil too with nil_ok).
    def instance(value, classes, name, nil_ok: false, expected: nil)
      return value if nil_ok && value.nil?
      return value if classes.is_a?(Module) ? value.is_a?(classes) : classes.any? { |klass| value.is_a?(klass) }

      classes = Array(classes)
      expected ||= "#{classes.map { |klass| article(klass.name) }.join(' or ')}#{' or nil' if nil_ok}"
      type_error!(name, expected, value)
    end

    # A file path: a String, or anything with #to_path (a Pathname), not
    # empty. Returns the String.
    def path(value, name)
      value = value.to_path if value.respond_to?(:to_path)
      type_error!(name, "a String or Pathname", value) unless value.is_a?(String)
      value_error!(name, "a non-empty path", value) if value.empty?
      value
    end

    def article(name)
      name.to_s.match?(/\A[AEIOU]/) ? "an #{name}" : "a #{name}"
    end
  end
end
