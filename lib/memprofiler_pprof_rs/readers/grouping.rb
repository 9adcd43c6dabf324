# frozen_string_literal: true

module MemprofilerPprof
  # What the rows of `top` can be: these groupings, or the values of a
  # label (`endpoint`; `label:file` for a key named like a grouping). Core
  # Ruby only: the command line checks `--by` before it loads the extension.
  module Grouping
    NAMES = %i[function line class file gem].freeze
    LABEL = /\A(?:label:)?[A-Za-z_][A-Za-z0-9_.]{0,63}\z/

    def self.valid?(by)
      NAMES.include?(by.to_sym) || by.to_s.match?(LABEL)
    end
  end
end
