# frozen_string_literal: true

module MemprofilerPprof
  # Callbacks around fork, so that flusher threads (which do not survive a
  # fork) can restart in the child. The collector itself needs no help: the
  # extension takes its locks around fork(2) and starts a fresh interval in
  # the child.
  #
  #   handler = MemprofilerPprof::Atfork.at_fork(:child) { restart_threads }
  #   handler.remove!
  #
  # Stages: :prepare (in the parent, before forking), :parent (in the parent,
  # after), :child (in the child). Covered: Kernel#fork, Process.fork,
  # `fork { }`, IO.popen("-") (all go through Process._fork on Ruby 3.1+) and
  # Process.daemon (which forks in C without Process._fork).
  #
  # An exception from a handler is reported on $stderr, never raised into the
  # forking code.
  module Atfork
    STAGES = %i[prepare parent child].freeze

    # A registered callback; `remove!` unregisters it.
    class Handler
      attr_reader :stage

      def initialize(stage, block)
        @stage = stage
        @block = block
      end

      def call
        @block.call
      rescue Exception => e # rubocop:disable Lint/RescueException
        # A fork must not fail because a profiler callback did.
        warn("memprofiler_pprof_rs: at_fork(#{@stage.inspect}) handler failed: #{e.class}: #{e.message}")
      end

      def remove!
        Atfork.remove(self)
      end
    end

    @handlers = [].freeze
    @registration_lock = Mutex.new

    class << self
      def at_fork(stage = :prepare, &block)
        raise ArgumentError, "at_fork stage must be one of #{STAGES.inspect}, got #{stage.inspect}" unless STAGES.include?(stage)
        raise ArgumentError, "at_fork needs a block" unless block

        handler = Handler.new(stage, block)
        # Copy on write: running the handlers (in a child, possibly forked
        # while another thread was registering) never needs the lock.
        @registration_lock.synchronize { @handlers = (@handlers + [handler]).freeze }
        handler
      end

      def remove(handler)
        @registration_lock.synchronize do
          @handlers = @handlers.reject { |h| h.equal?(handler) }.freeze
        end
        nil
      end

      attr_reader :handlers

      # Runs the handlers of `stage`; children's handlers in registration
      # order, :prepare in reverse (as pthread_atfork does).
      def run(stage)
        selected = @handlers.select { |h| h.stage == stage }
        selected.reverse! if stage == :prepare
        selected.each(&:call)
        nil
      end

      # After a fork, on either side. In the child, a lock held by a parent
      # thread that no longer exists must not block registration.
      def after_fork(in_child:)
        if in_child
          @registration_lock = Mutex.new
          run(:child)
        else
          run(:parent)
        end
      end
    end

    # Prepended to Process's singleton class. Ruby 3.1+ routes every fork
    # made from Ruby through Process._fork.
    module ProcessForkHook
      def _fork
        Atfork.run(:prepare)
        pid = super
        Atfork.after_fork(in_child: pid.zero?)
        pid
      end
    end

    # Process.daemon forks in C (daemon(3)): only the child returns.
    module ProcessDaemonHook
      def daemon(*args)
        Atfork.run(:prepare)
        result = super
        Atfork.after_fork(in_child: true)
        result
      end
    end

    # Every Ruby the gemspec allows (3.1+) has Process._fork.
    Process.singleton_class.prepend(ProcessForkHook)
    Process.singleton_class.prepend(ProcessDaemonHook)
  end
end
