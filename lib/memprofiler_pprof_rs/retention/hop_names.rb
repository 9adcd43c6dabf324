# frozen_string_literal: true

module MemprofilerPprof
  module Retention
    # How one object holds the next on a retention path, in the terms a
    # person uses: a constant, an instance variable, a Hash key, an Array
    # index, a Struct member, a block's captured variable, a thread-local.
    # Runs in the retention report's child. Core methods are called unbound,
    # so that an object's own #class, #[] or #method_missing is never run,
    # and a BasicObject is named too.
    module HopNames
      KERNEL_CLASS = Kernel.instance_method(:class)
      KERNEL_IVARS = Kernel.instance_method(:instance_variables)
      KERNEL_IVAR_GET = Kernel.instance_method(:instance_variable_get)
      MODULE_NAME = Module.instance_method(:name)
      MODULE_CONSTANTS = Module.instance_method(:constants)
      MODULE_CONST_GET = Module.instance_method(:const_get)
      MODULE_AUTOLOAD = Module.instance_method(:autoload?)
      MODULE_CVARS = Module.instance_method(:class_variables)
      MODULE_CVAR_GET = Module.instance_method(:class_variable_get)
      HASH_EACH_PAIR = Hash.instance_method(:each_pair)
      ARRAY_INDEX = Array.instance_method(:index)
      STRUCT_EACH_PAIR = Struct.instance_method(:each_pair)
      THREAD_KEYS = Thread.instance_method(:keys)
      THREAD_AREF = Thread.instance_method(:[])
      THREAD_VARIABLES = Thread.instance_method(:thread_variables)
      THREAD_VARIABLE_GET = Thread.instance_method(:thread_variable_get)
      THREAD_NAME = Thread.instance_method(:name)
      PROC_BINDING = Proc.instance_method(:binding)
      MODULE_TO_S = Module.instance_method(:to_s)
      EQUAL = BasicObject.instance_method(:equal?)
      # A key or a class name longer than this is cut, with "...".
      MAX_TEXT = 60

      module_function

      # [kind, reference]: how `parent` holds `child`. Kinds: "constant",
      # "class_ivar", "class_var", "ivar", "hash_value", "hash_key",
      # "index", "member", "captured", "thread_local", "thread_variable",
      # "stack" (a thread's frames: a local variable, an argument, self),
      # "toplevel_local" (a local variable of the main script),
      # "singleton_class", "method_entry" (a method's definition, which holds
      # define_method's block), "block" (a Proc's env; ref: where the block
      # is), "internal" (one of Ruby's internal objects), "reference" (one
      # Ruby does not name, such as a C extension's).
      #
      # `grandparent` (what held `parent`, or nil) names what a Proc's env
      # holds: the block's captured variable.
      def describe(parent, child, grandparent = nil)
        return internal_hop(parent, child, grandparent) if internal?(parent)

        if same?(parent, Thread.main)
          # The main script's locals, on the main thread's stack.
          local = toplevel_local(child)
          return ["toplevel_local", local] if local
        end

        quietly do
          (Module === parent && module_hop(parent, child)) || # rubocop:disable Style/CaseEquality
            ivar_hop(parent, child) || container_hop(parent, child) || unnamed_hop(parent, child)
        end
      rescue StandardError
        ["reference", nil] # (an object that refused to be looked into: the hop is still there)
      end

      # From one of Ruby's internal objects: a main-script local or a
      # block's captured variable when it is an env, else its type.
      def internal_hop(env, child, grandparent)
        local = toplevel_local(child)
        return ["toplevel_local", local] if local

        captured = Proc === grandparent && captured_hop(grandparent, child) # rubocop:disable Style/CaseEquality
        captured || ["internal", env.type.to_s.delete_prefix("T_").downcase]
      end

      # What Ruby does not name but a person can: a class's singleton class,
      # the definition of a method (define_method's block), a block's
      # captured variables (through its env).
      def unnamed_hop(parent, child)
        if Module === parent && Module === child && child.singleton_class? # rubocop:disable Style/CaseEquality
          ["singleton_class", nil]
        elsif Module === parent && internal?(child) # rubocop:disable Style/CaseEquality
          ["method_entry", nil]
        elsif Proc === parent && internal?(child) # rubocop:disable Style/CaseEquality
          ["block", block_location(parent)]
        else
          ["reference", nil]
        end
      end

      # "sinatra/base.rb:1273": the file's last two parts, as a person
      # finds it in a gem.
      def block_location(proc)
        file, line = proc.source_location
        file ? cut("#{file.split('/').last(2).join('/')}:#{line}") : nil
      end

      # The same object, whatever `a` thinks equal? means.
      def same?(a, b)
        EQUAL.bind_call(a, b)
      end

      # A Hash key or a thread-local's name as text: core values by
      # #inspect, anything else by its class (its own #inspect could be
      # anything, or raise).
      def key_text(key)
        if CORE_KEYS.any? { |core| Kernel.instance_method(:instance_of?).bind_call(key, core) }
          cut(key.inspect)
        else
          "#<#{class_name(key)}>"
        end
      rescue TypeError # a BasicObject
        "#<#{class_name(key)}>"
      end

      CORE_KEYS = [String, Symbol, Integer, Float, NilClass, TrueClass, FalseClass].freeze

      # A class name for any object; a module's own name for a module.
      def class_name(object)
        return "(internal #{object.type.to_s.delete_prefix('T_').downcase})" if internal?(object)
        return module_name(object) if Module === object # rubocop:disable Style/CaseEquality

        module_name(KERNEL_CLASS.bind_call(object))
      rescue TypeError
        "BasicObject" # (not a Kernel: its class cannot be asked without running its code)
      end

      def module_name(mod)
        cut(MODULE_NAME.bind_call(mod) || MODULE_TO_S.bind_call(mod))
      rescue StandardError
        "(anonymous)"
      end

      # A thread as a person tells them apart: its name, "main", or its
      # object's address.
      def thread_name(thread)
        name = THREAD_NAME.bind_call(thread)
        return cut(name) if name
        return "main" if same?(thread, Thread.main)

        format("0x%x", Kernel.instance_method(:__id__).bind_call(thread))
      end

      def internal?(object)
        ObjectSpace::InternalObjectWrapper === object # rubocop:disable Style/CaseEquality
      end

      def module_hop(mod, child)
        MODULE_CONSTANTS.bind_call(mod, false).each do |name|
          next if MODULE_AUTOLOAD.bind_call(mod, name) # (not loaded: nothing to hold)

          value = begin
            MODULE_CONST_GET.bind_call(mod, name, false)
          rescue StandardError, LoadError
            next
          end
          return ["constant", name.to_s] if same?(value, child)
        end
        KERNEL_IVARS.bind_call(mod).each do |name|
          return ["class_ivar", name.to_s] if same?(KERNEL_IVAR_GET.bind_call(mod, name), child)
        end
        MODULE_CVARS.bind_call(mod, false).each do |name|
          return ["class_var", name.to_s] if same?(MODULE_CVAR_GET.bind_call(mod, name), child)
        end
        nil
      end

      def ivar_hop(parent, child)
        KERNEL_IVARS.bind_call(parent).each do |name|
          return ["ivar", name.to_s] if same?(KERNEL_IVAR_GET.bind_call(parent, name), child)
        end
        nil
      rescue TypeError # a BasicObject
        nil
      end

      def container_hop(parent, child)
        case parent
        when Hash then hash_hop(parent, child)
        when Array
          index = ARRAY_INDEX.bind_call(parent) { |element| same?(element, child) }
          index && ["index", index.to_s]
        when Struct
          STRUCT_EACH_PAIR.bind_call(parent) { |name, value| return ["member", name.to_s] if same?(value, child) }
          nil
        when Proc then captured_hop(parent, child)
        when Thread then thread_hop(parent, child)
        end
      end

      def hash_hop(hash, child)
        HASH_EACH_PAIR.bind_call(hash) do |key, value|
          return ["hash_value", key_text(key)] if same?(value, child)
          return ["hash_key", key_text(key)] if same?(key, child)
        end
        nil
      end

      def captured_hop(proc, child)
        binding = PROC_BINDING.bind_call(proc)
        binding.local_variables.each do |name|
          return ["captured", name.to_s] if same?(binding.local_variable_get(name), child)
        end
        nil
      rescue ArgumentError # (a Proc made from a method or a C function has no binding)
        nil
      end

      def toplevel_local(child)
        TOPLEVEL_BINDING.local_variables.find { |name| same?(TOPLEVEL_BINDING.local_variable_get(name), child) }&.to_s
      end

      def thread_hop(thread, child)
        THREAD_KEYS.bind_call(thread).each do |key|
          return ["thread_local", key_text(key)] if same?(THREAD_AREF.bind_call(thread, key), child)
        end
        THREAD_VARIABLES.bind_call(thread).each do |key|
          return ["thread_variable", key_text(key)] if same?(THREAD_VARIABLE_GET.bind_call(thread, key), child)
        end
        ["stack", thread_name(thread)]
      end

      # Valid UTF-8 (for the JSON answer), at most MAX_TEXT characters.
      def cut(text)
        text = text.to_s.encode(Encoding::UTF_8, invalid: :replace, undef: :replace)
        text.length > MAX_TEXT ? "#{text[0, MAX_TEXT - 3]}..." : text
      end

      # Deprecated constants warn when read.
      def quietly
        verbose = $VERBOSE
        $VERBOSE = nil
        yield
      ensure
        $VERBOSE = verbose
      end
    end
  end
end
