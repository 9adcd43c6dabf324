# frozen_string_literal: true

# The workloads bench/run times. Each is a lambda run after a warm-up call;
# its value is ignored. An optional argument sizes the loop workloads down
# (iterations), for bench/run callgrind.
module BenchWorkloads
  # (1) Allocation-heavy: 1M iterations x 4 small objects (a String from
  # interpolation and its to_s, an Array, a Hash) through 3 call levels.
  module AllocLoop
    def self.level3(i) = ["s#{i}", { k: i }]
    def self.level2(i) = level3(i)
    def self.level1(i) = level2(i)

    def self.run(iterations = 1_000_000)
      iterations.times { |i| level1(i) }
    end
  end

  # (2) A compute loop that allocates nothing: integer arithmetic, method
  # calls, array indexing (and a C method call per iteration: Integer#abs).
  module ComputeLoop
    TABLE = [3, 1, 4, 1, 5, 9, 2, 6].freeze

    def self.step(sum, i) = (sum + (TABLE[i & 7] * 3)).abs % 1_000_003

    def self.run(iterations = 15_000_000)
      sum = 0
      i = 0
      while i < iterations
        sum = step(sum, i)
        i += 1
      end
      sum
    end
  end

  # (6) Allocation-heavy at depth: the alloc loop's objects (a String from
  # interpolation and its to_s, an Array, a Hash), 100k iterations, each
  # allocated DEPTH Ruby frames deep (counting C frames, as a backtrace
  # does), below a recursion through three methods. A Rails request
  # allocates 120+ frames deep; the alloc loop does it at ~8, where a
  # sampled allocation's backtrace is cheap.
  module DeepLoop
    DEPTH = 65

    def self.descend_a(levels, iterations) = levels.zero? ? loop_at_depth(iterations) : descend_b(levels - 1, iterations)
    def self.descend_b(levels, iterations) = levels.zero? ? loop_at_depth(iterations) : descend_c(levels - 1, iterations)
    def self.descend_c(levels, iterations) = levels.zero? ? loop_at_depth(iterations) : descend_a(levels - 1, iterations)

    def self.loop_at_depth(iterations)
      iterations.times { |i| leaf(i) }
    end

    def self.leaf(i) = ["s#{i}", { k: i }]

    # Frames below run's own besides the recursion's `levels`: the last
    # descend_*, loop_at_depth, Integer#times, its block, leaf.
    FIXED_FRAMES = 5

    # The recursion is sized from the caller's depth, so that leaf runs at
    # DEPTH frames wherever run is called from (worker, warm-up, callgrind).
    def self.run(iterations = 100_000, depth: DEPTH)
      levels = depth - caller(0).size - FIXED_FRAMES
      raise ArgumentError, "bench: already #{caller(0).size} frames deep" if levels.negative?

      descend_a(levels, iterations)
    end
  end

  # (3) Call-heavy: seeded random call chains (depth 1..100) through
  # thousands of generated methods; each chain ends by allocating an
  # instance of one of thousands of classes (sometimes with a String or an
  # Array), kept in a retained set that grows during the first half and
  # shrinks during the second. Chains follow one of PATHS seeded call paths,
  # as a real program's allocations come from a bounded set of call sites
  # (so stacks repeat, a few thousand of them, as in an application).
  module Scenario
    METHODS = 3_000
    CLASSES = 2_000
    PATHS = 4_000
    FANOUT = 4
    SEED = 20_261_129

    # Per-run state: the seeded random source and the retained set.
    class Context
      attr_reader :depth, :retained

      # retain_all: every leaf object is kept (to build a large live set).
      def initialize(seed, retain_all: false)
        @rng = Random.new(seed)
        @retained = []
        @depth = 1
        @growing = true
        @retain_all = retain_all
      end

      def start_chain(growing)
        @growing = growing
        @path = @rng.rand(PATHS)
        @depth = 1 + (((@path * 2_654_435_761) >> 9) % 100)
      end

      # The branch a path takes at `level`: a fixed function of both.
      def pick(level) = (((@path * 2_654_435_761) ^ (level * 40_503)) >> 5) & (FANOUT - 1)

      def leaf
        object = CLASS_LIST[@rng.rand(CLASSES)].new
        case @rng.rand(4)
        when 0 then object.payload = "payload" * @rng.rand(1..8)
        when 1 then object.payload = Array.new(@rng.rand(1..6))
        end
        if @retain_all
          @retained << object
        elsif @growing
          @retained << object if @rng.rand < 0.6
        elsif !@retained.empty? && @rng.rand < 0.7
          index = @rng.rand(@retained.size)
          @retained[index] = @retained.last
          @retained.pop
        end
        object
      end
    end

    # Generated classes: Scenario::C0 ... C1999, each with a payload slot.
    CLASS_LIST = Array.new(CLASSES) do |i|
      klass = Class.new { attr_accessor :payload }
      const_set("C#{i}", klass)
    end

    # Generated methods s0 ... s2999; each calls one of FANOUT fixed random
    # others (so stacks vary but repeat), a little arithmetic on the way.
    module Calls
      rng = Random.new(SEED)
      METHODS.times do |i|
        targets = Array.new(FANOUT) { rng.rand(METHODS) }
        branches = targets.each_with_index.map { |t, k| "when #{k} then s#{t}(ctx, level + 1, acc + #{k})" }
        module_eval(<<~RUBY, "scenario_calls.rb", i * 10 + 1)
          def self.s#{i}(ctx, level, acc)
            return ctx.leaf if level >= ctx.depth
            j = 0
            while j < 12
              acc = ((acc * 31) + j) % 65_521
              j += 1
            end
            case ctx.pick(level)
            #{branches.join("\n")}
            end
          end
        RUBY
      end
    end

    # Returns the context. `at_peak` is called once the retained set is
    # largest (between the two halves).
    def self.run(chains = 170_000, seed: SEED, at_peak: nil)
      ctx = Context.new(seed)
      chains.times do |n|
        at_peak&.call(ctx) if n == chains / 2
        ctx.start_chain(n < chains / 2)
        Calls.s0(ctx, 0, n)
      end
      ctx
    end
  end

  # What one iteration of a loop workload allocates, by class, and its
  # iterations when not sized down: the truth the gem's per-class
  # estimates are checked against (bench/run's "estimate error").
  CLASS_COUNTS = {
    "alloc" => { iterations: 1_000_000, per_iteration: { "String" => 2, "Array" => 1, "Hash" => 1 } },
    "deep" => { iterations: 100_000, per_iteration: { "String" => 2, "Array" => 1, "Hash" => 1 } }
  }.freeze

  ALL = {
    "alloc" => ->(*size) { AllocLoop.run(*size) },
    "compute" => ->(*size) { ComputeLoop.run(*size) },
    "scenario" => -> { Scenario.run },
    "deep" => ->(*size) { DeepLoop.run(*size) }
  }.freeze

  WARMUPS = {
    "alloc" => -> { AllocLoop.run(10_000) },
    "compute" => -> { ComputeLoop.run(10_000) },
    "scenario" => -> { Scenario.run(500, seed: 1) },
    "deep" => -> { DeepLoop.run(2_500) }
  }.freeze
end
