# frozen_string_literal: true

module MemprofilerPprof
  # Where a method's blocks are, so that profiles can name them. Ruby's
  # rb_profile_frames reports a frame that runs a block (or a rescue clause)
  # of a method as the method itself, with the block's line; from which
  # lines hold whose code, the native layer tells them apart
  # (crates/sampler/src/block_frames.rs). Called by Collector#flush, at most once per
  # method (the native side caches the answer), never from an allocation
  # hook. Internal: not part of the gem's API.
  module MethodBlocks
    # Child instruction sequences that run as frames of their method:
    # "block in", "block (2 levels) in", "rescue in", "ensure in" (nested:
    # "rescue in block in"). Not a `def` inside the method, nor a class body.
    FRAME_LABEL = /\A(?:(?:block(?: \(\d+ levels\))?|rescue|ensure) in )+/
    # A method with more blocks than this is described by its first ones only.
    MAX_BLOCKS = 1000
    # Methods prepended over the one sought (instrumentation) are skipped,
    # up to this many.
    MAX_SUPER_STEPS = 16

    # Bound once, so that classes redefining these methods cannot change
    # (or break) what is read here.
    CONST_DEFINED = Module.instance_method(:const_defined?)
    CONST_GET = Module.instance_method(:const_get)
    AUTOLOAD_P = Module.instance_method(:autoload?)
    INSTANCE_METHOD = Module.instance_method(:instance_method)
    SINGLETON_CLASS = Kernel.instance_method(:singleton_class)
    CONSTANT_NAME = /\A[A-Z]\w*\z/

    module_function

    # The blocks of method `name` of the class or module named `class_path`
    # (of its singleton class if `singleton`), if its code starts at
    # path:first_lineno:
    #   [[prefix, first_line, last_line, parent_index_or_nil, kind], ...]
    # prefix: "block in ", "block (2 levels) in ", "rescue in "...; kind:
    # "block", "rescue" or "ensure"; parents before their children.
    # nil when the method has no blocks or cannot be found again by name (an
    # anonymous class, a refinement, a method redefined since): its frames
    # then keep its name. Raises only what is not a StandardError or a
    # ScriptError (Interrupt, a Thread#raise), which is the program's.
    def describe(class_path, name, singleton, path, first_lineno)
      iseq = method_iseq(class_path, name, singleton, path, first_lineno)
      return nil unless iseq

      blocks = []
      add_blocks(iseq, nil, iseq.label, blocks)
      blocks.empty? ? nil : blocks
    rescue StandardError, ScriptError
      nil
    end

    # The instruction sequence of that method, if its code starts at
    # path:first_lineno; methods prepended over it (a module's `super`
    # chain, e.g. instrumentation) are looked through.
    def method_iseq(class_path, name, singleton, path, first_lineno)
      return nil unless defined?(RubyVM::InstructionSequence) && class_path && name

      owner = constant(class_path)
      return nil unless Module === owner # rubocop:disable Style/CaseEquality -- is_a? could be overridden

      owner = SINGLETON_CLASS.bind_call(owner) if singleton
      method = INSTANCE_METHOD.bind_call(owner, name)
      MAX_SUPER_STEPS.times do
        iseq = RubyVM::InstructionSequence.of(method)
        return iseq if iseq && iseq.path == path && iseq.first_lineno == first_lineno
        return nil unless (method = method.super_method)
      end
      nil
    rescue NameError
      nil
    end

    # The constant at a path such as "Foo::Bar", without loading anything
    # (a pending autoload) or calling const_missing.
    def constant(path)
      path.split("::").reduce(Object) do |scope, part|
        return nil unless Module === scope && CONSTANT_NAME.match?(part) && # rubocop:disable Style/CaseEquality
                          CONST_DEFINED.bind_call(scope, part, false) && !AUTOLOAD_P.bind_call(scope, part, false)

        CONST_GET.bind_call(scope, part, false)
      end
    end

    def add_blocks(iseq, parent, method_label, blocks)
      iseq.each_child do |child|
        label = child.label
        next unless label.end_with?(" in #{method_label}") && (prefix = label[FRAME_LABEL])
        break if blocks.size >= MAX_BLOCKS

        kind = prefix[/\A\w+/] # "block", "rescue" or "ensure": the innermost
        lines = kind == "block" ? block_lines(child) : own_lines(child)
        next if lines.empty?

        blocks << [prefix, lines.min, lines.max, parent, kind]
        add_blocks(child, blocks.size - 1, method_label, blocks)
      end
    end

    # A block's lines, from its first to its last: its call event is on its
    # first line (`do |x|` or `{ |x|`) and its return event on its closing
    # `end` or `}`. (Its trace points are cheap to read; its instruction list
    # is not.)
    def block_lines(iseq)
      iseq.trace_points.map(&:first) << iseq.first_lineno
    end

    # A rescue or ensure clause's lines (it has no call and return events;
    # its first_lineno is its method's): those of its own instructions, the
    # line numbers at the top level of its instruction list. Clauses are
    # small, so reading the list is.
    def own_lines(iseq)
      iseq.to_a[13].grep(Integer)
    end
  end
end
