# frozen_string_literal: true

module MemprofilerPprof
  VERSION = "0.1.0"
end
