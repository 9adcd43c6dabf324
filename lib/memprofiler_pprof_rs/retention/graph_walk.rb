# frozen_string_literal: true

require "objspace"
require_relative "hop_names"

module MemprofilerPprof
  module Retention
    # The shortest chains of references from the GC's roots to a set of
    # target objects, found by walking the heap with
    # ObjectSpace.reachable_objects_from. Runs in the child process a
    # retention report forks: it reads the whole heap, and what it allocates
    # (~100 bytes an object reached) is the child's.
    #
    # Roots come first in the order a person reads them: the constants
    # (everything under Object), global variables, the main script's local
    # variables, each thread (its locals, then its frames), then the GC's
    # own root sets, which start ROOT_SET_START further. A hop to one of
    # Ruby's internal objects (an iseq, a method entry, an env) counts
    # INTERNAL_HOP, so that a chain of named references wins over a
    # slightly shorter one through the VM's insides (an inline constant
    # cache holds a constant's value too). The conservative scan of the
    # machine stack is left out: in this process it holds the walk's own
    # temporaries.
    #
    # Since a hop's length depends only on the object it leads to, the
    # first way to reach an object, taken in order of distance, is a
    # shortest one: objects wait in two queues, each in order of distance
    # (ordinary objects one further than their parent; internal ones and
    # the GC's root sets further), and the nearer head goes first. So one
    # table (object => where it was reached from) is all the walk keeps.
    #
    # Nothing reachable only through `exclude` counts: the caller puts its
    # own containers there (the targets, the collectors), and the walk adds
    # its own. Those objects are reached but never expanded.
    class GraphWalk
      INTERNAL_HOP = 3
      # The GC's own root sets start this far: a path from a named root
      # (a constant, a global) that is up to this much longer wins.
      ROOT_SET_START = 2
      # References followed between two looks at the clock and the bounds.
      CHECK_EVERY = 2048
      MEMORY_CHECK_EVERY = CHECK_EVERY * 32
      IGNORED_ROOTS = %w[machine_context].freeze

      INTERNAL = ObjectSpace::InternalObjectWrapper

      # Where a path starts: kind :constants (name "Object"), :global
      # ("$name"), :toplevel_local (a local variable of the main script),
      # :thread_local and :thread_variable ("thread[:key]"), :thread (its
      # name) or :root (the GC's root set).
      Root = Struct.new(:kind, :name)

      # paths: target => [Root, node, ..., target]; reached: objects
      # reached; stopped: nil, :time, :objects or :memory.
      Result = Struct.new(:paths, :reached, :stopped, keyword_init: true)

      # `targets`: object => its site's index; `wanted[site]`: how many of
      # its objects' paths are enough (the walk ends once every site has
      # them). `memory`: the child's private bytes so far (nil where unknown).
      def initialize(targets, wanted:, exclude:, deadline:, max_objects:, max_bytes:, memory:)
        @targets = targets
        @wanted = wanted
        @found_per_site = Array.new(wanted.size, 0)
        @sites_done = wanted.count(&:zero?)
        @exclude = exclude
        @deadline = deadline
        @max_objects = max_objects
        @max_bytes = max_bytes
        @memory = memory
        @reached = 0
        @visits = 0
        @root_set = []
        @named_seeds = []
        # Object => the object it was first reached from (a root's: its
        # Root). Internal objects are keyed by their address (internal_key).
        @parent = {}.compare_by_identity
        @internal_parent = {}
        @found = {}.compare_by_identity
        # The two queues: objects, their distances, the next to take.
        @near = []
        @near_distance = []
        @far = []
        @far_distance = []
        @near_next = 0
        @far_next = 0
        [self, @targets, @exclude, @parent, @internal_parent, @found, @near, @near_distance, @far,
         @far_distance, @root_set, @named_seeds, @wanted, @found_per_site].each { |own| @exclude[own] = true }
      end

      def run
        stopped = catch(:bound) do
          seed_roots
          # (What the fork and the listing copied counts too.)
          check_memory
          walk
        end
        paths = {}.compare_by_identity # (a target's own #hash may recurse through all it holds)
        @found.each_key { |target| paths[target] = path_to(target) }
        Result.new(paths: paths,
                   reached: @reached, stopped: stopped)
      end

      private

      # Object (the constants) at 0, then the other named roots at 1, once
      # Object's constants are queued at 1 before them: a constant wins over
      # a local variable or a global holding the same object.
      def seed_roots
        seed(Object, Root.new(:constants, "Object"))
        HopNames.quietly do
          global_variables.each do |name|
            value = begin
              eval(name.to_s) # rubocop:disable Security/Eval (a global's name, from global_variables)
            rescue StandardError, ScriptError
              next # (a special variable that cannot be read here)
            end
            seed(value, Root.new(:global, name.to_s))
          end
        end
        TOPLEVEL_BINDING.local_variables.each do |name|
          seed(TOPLEVEL_BINDING.local_variable_get(name), Root.new(:toplevel_local, name.to_s))
        end
        Thread.list.each { |thread| seed_thread(thread) }
        roots = ObjectSpace.reachable_objects_from_root
        @exclude[roots] = true
        roots.each_pair do |category, objects|
          next if IGNORED_ROOTS.include?(category)

          @exclude[objects] = true
          objects.each { |object| seed_root_set(object, Root.new(:root, category)) }
        end
        @exclude[@root_set] = true
      end

      # The GC's root sets are ROOT_SET_START away. Internal objects among
      # them go to the far queue now (nothing reaches one nearer than
      # INTERNAL_HOP); the others wait until the near queue is that far, so
      # that what a named root reaches nearer is reached from it.
      def seed_root_set(object, root)
        return unless heap_object?(object)

        if INTERNAL === object
          reach(object, root, ROOT_SET_START, far: true)
        else
          @root_set << object << root
        end
      end

      # A thread's locals by name (where a Ruby keeps them, in the thread or
      # in its fiber, does not matter then), then the thread (its frames).
      def seed_thread(thread)
        name = HopNames.thread_name(thread)
        HopNames::THREAD_KEYS.bind_call(thread).each do |key|
          seed(HopNames::THREAD_AREF.bind_call(thread, key),
               Root.new(:thread_local, "#{name}[#{HopNames.key_text(key)}]"))
        end
        HopNames::THREAD_VARIABLES.bind_call(thread).each do |key|
          seed(HopNames::THREAD_VARIABLE_GET.bind_call(thread, key),
               Root.new(:thread_variable, "#{name}[#{HopNames.key_text(key)}]"))
        end
        seed(thread, Root.new(:thread, name))
      end

      def seed(object, root)
        return unless heap_object?(object)

        if root.kind == :constants
          reach(object, root, 0, far: false)
        else
          @named_seeds << object << root
        end
      end

      def release(pending, distance)
        pending.each_slice(2) { |object, root| reach(object, root, distance, far: false) }
        pending.clear
      end

      # Takes the nearer queue's next object until none is left, or every
      # target is reached.
      def walk
        loop do
          return nil if all_found?

          near = @near_next < @near.size ? @near_distance[@near_next] : nil
          if !@named_seeds.empty? && (near.nil? || near >= 1)
            release(@named_seeds, 1)
            next
          end
          if !@root_set.empty? && (near.nil? || near >= ROOT_SET_START)
            release(@root_set, ROOT_SET_START)
            next
          end
          far = @far_next < @far.size ? @far_distance[@far_next] : nil
          if near && (far.nil? || near <= far)
            node = @near[@near_next]
            @near[@near_next] = nil
            @near_next += 1
            expand(node, near)
          elsif far
            node = @far[@far_next]
            @far[@far_next] = nil
            @far_next += 1
            expand(node, far)
          else
            return nil
          end
        end
      end

      def all_found?
        @sites_done == @wanted.size
      end

      def found_target(node, site)
        @found[node] = true
        @found_per_site[site] += 1
        @sites_done += 1 if @found_per_site[site] == @wanted[site]
      end

      # Throws :bound with :time, :objects or :memory once the walk is past
      # one (the memory every MEMORY_CHECK_EVERY references: reading it
      # takes a walk of the page tables).
      def check_bounds
        throw(:bound, :time) if Process.clock_gettime(Process::CLOCK_MONOTONIC) > @deadline
        throw(:bound, :objects) if @reached > @max_objects
        check_memory if (@visits % MEMORY_CHECK_EVERY).zero?
      end

      def check_memory
        bytes = @memory.call
        throw(:bound, :memory) if bytes && bytes > @max_bytes
      end

      # Reaches the node's children; stops once every target is reached (a
      # Hash of millions need not be gone through to its end).
      def expand(node, distance)
        return if !(INTERNAL === node) && @exclude.key?(node) # (=== for BasicObjects)

        each_child(node) do |child|
          internal = INTERNAL === child
          reach(child, node, distance + (internal ? INTERNAL_HOP : 1), far: internal)
          return if all_found?
        end
      end

      # What `node` references. Plain Arrays and Hashes are gone through in
      # place: ObjectSpace.reachable_objects_from makes an Array and a Hash
      # for each call, ~400 bytes that stay (GC is off in the child), and
      # such containers are most of a big heap. (Their class, reached from
      # the constants anyway, is left out.) Strings and numbers hold nothing
      # a path could go on through. (Module#=== and #instance_of? are C and
      # allocate nothing; UnboundMethod#bind_call would, on Ruby 3.1.)
      #
      # Not seen that way: instance variables set on a plain Array or Hash,
      # and a singleton #each (which would run).
      def each_child(node, &block)
        case node
        when *LEAVES
          each_referenced(node, &block) unless LEAVES.any? { |leaf| node.instance_of?(leaf) }
        when Array
          return each_referenced(node, &block) unless node.instance_of?(Array)

          node.each { |element| yield element if heap_object?(element) }
        when Hash
          node.instance_of?(Hash) ? each_in_hash(node, &block) : each_referenced(node, &block)
        else each_referenced(node, &block)
        end
      end

      def each_referenced(node, &block)
        ObjectSpace.reachable_objects_from(node)&.each(&block)
      end

      def each_in_hash(hash)
        hash.each_pair do |key, value|
          yield key if heap_object?(key)
          yield value if heap_object?(value)
        end
        default = hash.default_proc || hash.default
        yield default if heap_object?(default)
      end

      LEAVES = [String, Symbol, Float, Integer, Rational, Complex].freeze

      # Queues `node` the first time it is reached. The bounds are looked at
      # every CHECK_EVERY references followed, new or not.
      def reach(node, from, distance, far:)
        @visits += 1
        check_bounds if (@visits % CHECK_EVERY).zero?
        if INTERNAL === node
          key = internal_key(node)
          return if @internal_parent.key?(key)

          @internal_parent[key] = from
        else
          return if @parent.key?(node)

          @parent[node] = from
          site = @targets[node]
          found_target(node, site) if site
        end
        if far
          @far << node
          @far_distance << distance
        else
          @near << node
          @near_distance << distance
        end
        @reached += 1
      end

      # [root, first node, ..., target]: parents followed back to a root.
      def path_to(target)
        path = [target]
        node = target
        loop do
          from = INTERNAL === node ? @internal_parent[internal_key(node)] : @parent[node]
          path << from
          break if Root === from # rubocop:disable Style/CaseEquality

          node = from
        end
        path.reverse
      end

      # An internal object's address, from its wrapper's #inspect: each
      # reachable_objects_from call wraps it anew, and #internal_object_id
      # would give it an object id (a table entry each; and object ids
      # changed in Ruby 4.0). Addresses stay put: GC is off in the child.
      def internal_key(wrapper)
        wrapper.inspect[/0x\h+/]
      end

      # Whether a value can hold references (the rest are immediates, or
      # hold nothing a path could go through).
      def heap_object?(value)
        !(NilClass === value || TrueClass === value || FalseClass === value || # rubocop:disable Style/CaseEquality
          Integer === value || Float === value || Symbol === value) # rubocop:disable Style/CaseEquality
      end
    end
  end
end
