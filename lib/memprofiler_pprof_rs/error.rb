# frozen_string_literal: true

module MemprofilerPprof
  # Included by every exception the gem raises on its own account, so that
  # `rescue MemprofilerPprof::Error` catches them all while each keeps its
  # Ruby superclass (a StateError is still a RuntimeError):
  #
  # - StateError (RuntimeError): a call the object's state refuses (mode=
  #   while running, a flush inside a flush, a finished merger);
  # - InternalError (RuntimeError): a bug of the gem's, please report it;
  # - UnsupportedRuntimeError: where the gem cannot profile safely;
  # - ProfileFormatError and ProfileMemoryLimitError, PprofReader's
  #   FormatError and MemoryLimitError: a profile that cannot be read;
  # - RetentionError: a retention report that could not be made.
  #
  # Wrong arguments raise Ruby's own ArgumentError and TypeError, naming
  # the value. StateError and InternalError are defined by the native
  # extension, which raises them.
  module Error; end
end
