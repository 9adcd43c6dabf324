# frozen_string_literal: true

require "objspace"
require_relative "hop_names"

module MemprofilerPprof
  module Retention
    # The shortest chains of references from the GC's roots to a set of
    # target objects, found by walking the heap with
    # ObjectSpace.reachable_objects_from. Runs in the child process a
    # retention report forks: it reads the whole heap, and what it allocates
    # (a few hundred bytes an object reached) is the child's.
    #
    # Roots come first in the order a person reads them: the constants
    # (everything under Object), global variables, the main script's local
    # variables, each thread (its stack and thread-locals), then the GC's
    # own root sets. A hop through one of
    # Ruby's internal objects (an iseq, a method entry, an env) counts
    # INTERNAL_HOP, so that a chain of named references wins over a
    # slightly shorter one through the VM's insides (an inline constant
    # cache holds a constant's value too). The conservative scan of the
    # machine stack is left out: in this process it holds the walk's own
    # temporaries.
    #
    # Nothing reachable only through `exclude` counts: the caller puts its
    # own containers there (the targets, the collectors), and the walk adds
    # its own. Those objects are reached but never expanded.
    class GraphWalk
      INTERNAL_HOP = 3
      # The GC's own root sets start this far: a path from a named root
      # (a constant, a global) that is up to this much longer wins.
      ROOT_SET_START = 2
      # Objects reached between two looks at the clock and the bounds.
      CHECK_EVERY = 2048
      IGNORED_ROOTS = %w[machine_context].freeze

      INTERNAL = ObjectSpace::InternalObjectWrapper

      # Where a path starts: kind :constants (name "Object"), :global
      # ("$name"), :toplevel_local (a local variable of the main script),
      # :thread_local and :thread_variable ("thread[:key]"), :thread (its
      # name) or :root (the GC's root set).
      Root = Struct.new(:kind, :name)

      # paths: target => [Root, node, ..., target]; reached: objects
      # reached; stopped: nil, :time or :objects.
      Result = Struct.new(:paths, :reached, :stopped, keyword_init: true)

      def initialize(targets, exclude:, deadline:, max_objects:)
        @targets = targets
        @exclude = exclude
        @deadline = deadline
        @max_objects = max_objects
        # Node key => best distance so far, and the node it was reached from
        # (a root's: its Root). Internal objects are keyed by their
        # address (internal_key).
        @distance = {}.compare_by_identity
        @parent = {}.compare_by_identity
        @internal_distance = {}
        @internal_parent = {}
        @found = {}.compare_by_identity
        @buckets = []
        [self, @targets, @exclude, @distance, @parent, @internal_distance, @internal_parent, @found,
         @buckets].each { |own| @exclude[own] = true }
      end

      def run
        seed_roots
        stopped = walk
        paths = {}.compare_by_identity # (a target's own #hash may recurse through all it holds)
        @found.each_key { |target| paths[target] = path_to(target) }
        Result.new(paths: paths,
                   reached: @distance.size + @internal_distance.size, stopped: stopped)
      end

      private

      def seed_roots
        seed(Object, Root.new(:constants, "Object"))
        quietly do
          global_variables.each do |name|
            value = begin
              eval(name.to_s) # rubocop:disable Security/Eval (a global's name, from global_variables)
            rescue StandardError
              next
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
          objects.each { |object| seed(object, Root.new(:root, category), ROOT_SET_START) }
        end
      end

      # A thread's locals by name (where a Ruby keeps them, in the thread or
      # in its fiber, does not matter then), then the thread (its frames).
      def seed_thread(thread)
        name = HopNames.thread_name(thread)
        thread.keys.each { |key| seed(thread[key], Root.new(:thread_local, "#{name}[#{key.inspect}]")) } # rubocop:disable Style/HashEachMethods (a Thread, no each_key)
        thread.thread_variables.each do |key|
          seed(thread.thread_variable_get(key), Root.new(:thread_variable, "#{name}[#{key.inspect}]"))
        end
        seed(thread, Root.new(:thread, name))
      end

      def seed(object, root, distance = 0)
        return unless heap_object?(object)

        reach(object, root, distance)
      end

      # Walks the buckets of distance in order; a node popped at a distance
      # it has since bettered is passed by.
      def walk
        distance = 0
        count = 0
        while distance < @buckets.size
          bucket = @buckets[distance]
          index = 0
          while bucket && index < bucket.size
            node = bucket[index]
            index += 1
            next if distance_of(node) < distance

            count += 1
            stopped = (count % CHECK_EVERY).zero? && bound_reached
            return stopped if stopped

            expand(node, distance)
            return nil if all_found_by?(distance)
          end
          @buckets[distance] = nil # (its nodes are done: let them go)
          distance += 1
        end
        nil
      end

      # :time or :objects once the walk is past a bound, else nil.
      def bound_reached
        return :time if Process.clock_gettime(Process::CLOCK_MONOTONIC) > @deadline

        :objects if @distance.size + @internal_distance.size > @max_objects
      end

      # Every target reached, each by a distance that can no longer be
      # bettered (nodes are expanded in order of distance, and each hop
      # adds at least 1).
      def all_found_by?(distance)
        @found.size == @targets.size && @found.each_key.all? { |target| @distance[target] <= distance + 1 }
      end

      def expand(node, distance)
        return if !(INTERNAL === node) && @exclude.key?(node) # (BasicObjects)

        ObjectSpace.reachable_objects_from(node)&.each do |child|
          hop = INTERNAL === child ? INTERNAL_HOP : 1
          reach(child, node, distance + hop)
        end
      end

      def reach(node, from, distance)
        if INTERNAL === node
          key = internal_key(node)
          known = @internal_distance[key]
          return if known && known <= distance

          @internal_distance[key] = distance
          @internal_parent[key] = from
        else
          known = @distance[node]
          return if known && known <= distance

          @distance[node] = distance
          @parent[node] = from
          @found[node] = true if @targets.key?(node)
        end
        (@buckets[distance] ||= []).tap { |bucket| @exclude[bucket] = true } << node
      end

      def distance_of(node)
        INTERNAL === node ? @internal_distance[internal_key(node)] : @distance[node]
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
      # changed in Ruby 4.0). Addresses stay put: the child turns automatic
      # compaction off.
      def internal_key(wrapper)
        wrapper.inspect[/0x\h+/]
      end

      # Whether a value can hold references (the rest are immediates, or
      # hold nothing a path could go through).
      def heap_object?(value)
        !(NilClass === value || TrueClass === value || FalseClass === value || # rubocop:disable Style/CaseEquality
          Integer === value || Float === value || Symbol === value) # rubocop:disable Style/CaseEquality
      end

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
