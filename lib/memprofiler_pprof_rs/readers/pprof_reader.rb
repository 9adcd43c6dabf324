# frozen_string_literal: true

require "stringio"

module MemprofilerPprof
  # Reads pprof profiles (gzipped or not) in plain Ruby, without protobuf or
  # Go: enough of the format to inspect what this gem writes.
  #
  #   profile = MemprofilerPprof::PprofReader.parse(data.pprof_data)
  #   profile.sample_type_names      # => ["alloc_objects", "alloc_space", ...]
  #   profile.samples.first.frames   # => [#<Frame name="Foo#bar" filename="app.rb" line=12>, ...]
  module PprofReader
    class FormatError < StandardError
      include Error
    end

    # Reading the profile would pass MemprofilerPprof::Profile.memory_limit.
    class MemoryLimitError < FormatError; end

    ValueType = Struct.new(:type, :unit)
    Label = Struct.new(:key, :str, :num, :num_unit)
    Function = Struct.new(:id, :name, :system_name, :filename, :start_line)
    Frame = Struct.new(:name, :filename, :line, :start_line)

    # A sample with its stack resolved to frames (leaf first). `values` is
    # pprof's name for the numbers and the reader's API; it hides Struct#values
    # (to_a still gives the members).
    Sample = Struct.new(:frames, :values, :labels) do # rubocop:disable Lint/StructNewOverride
      def value(profile, type_name)
        index = profile.sample_type_names.index(type_name) or
          raise ArgumentError, "no sample type #{type_name.inspect}"
        values[index]
      end
    end

    Profile = Struct.new(:sample_types, :samples, :functions, :strings, :time_nanos,
                         :duration_nanos, :period_type, :period, :comments,
                         :default_sample_type, :mapping_count, :location_count) do
      def sample_type_names
        sample_types.map(&:type)
      end

      # Sum of one sample type over all samples.
      def total(type_name)
        samples.sum { |s| s.value(self, type_name) }
      end
    end

    module_function

    # Ruby objects cost far more than the native reader's structures: bytes
    # per item of each kind, measured on this gem's profiles and on
    # label-heavy ones (the wire-format pass and the structs built from it
    # are alive together), rounded up.
    RUBY_BYTES = {
      "samples" => 1000, "sample_numbers" => 60, "labels" => 700, "locations" => 700, "lines" => 500,
      "functions" => 700, "strings" => 120, "string_bytes" => 2, "frames" => 8, "comments" => 64
    }.freeze

    def parse(bytes)
      bytes = bytes.b
      # Not Ruby's zlib: see MemprofilerPprof::Profile.gunzip (it can corrupt
      # memory under fork).
      bytes = MemprofilerPprof::Profile.gunzip(bytes) if bytes.start_with?("\x1f\x8b".b)
      check_bounds(bytes)
      decode_profile(bytes)
    rescue ProfileMemoryLimitError => e
      raise MemoryLimitError, e.message
    rescue ProfileFormatError => e
      raise FormatError, "not a gzipped pprof profile: #{e.message}"
    end

    # The native reader checks the profile first (stack depths, frames in
    # all, its own memory), and its counts bound what building it in Ruby
    # takes, under the same limit as every profile read back
    # (MemprofilerPprof::Profile.memory_limit). The objects built are the
    # caller's: the limit bounds each call, not the results kept.
    def check_bounds(plain)
      shape = MemprofilerPprof::Profile.parse(plain).send(:_native_shape).to_h
      needed = plain.bytesize * 2 + RUBY_BYTES.sum { |kind, bytes| shape.fetch(kind) * bytes }
      limit = MemprofilerPprof::Profile.memory_limit
      held = MemprofilerPprof::Profile.memory_held - shape.fetch("reserved_bytes")
      if needed + held > limit && held.positive?
        GC.start # profiles no longer referenced still hold their share
        held = MemprofilerPprof::Profile.memory_held - shape.fetch("reserved_bytes")
      end
      return if needed + held <= limit

      raise MemoryLimitError, "reading this profile in Ruby would take about #{megabytes(needed)} of memory" \
                              "#{", and the profiles already read hold #{megabytes(held)}" if held.positive?} " \
                              "(limit #{megabytes(limit)}, MemprofilerPprof::Profile.memory_limit); " \
                              "MemprofilerPprof::Profile reads it in far less"
    end

    def megabytes(bytes)
      mb = bytes / (1 << 20).to_f
      mb < 100 ? format("%.1f MB", mb) : "#{mb.round} MB"
    end

    def parse_file(path)
      parse(File.open(path, "rb") { |file| MemprofilerPprof::Profile.read_limited(file) })
    rescue ProfileFormatError, FormatError => e
      raise FormatError, "#{path}: #{e.message}"
    end

    # ----- protobuf wire format ---------------------------------------------

    # Yields (field_number, wire_type, value) for each field of a message.
    def each_field(bytes)
      io = StringIO.new(bytes)
      until io.eof?
        key = read_varint(io)
        field = key >> 3
        case key & 7
        when 0 then yield field, 0, read_varint(io)
        when 1 then yield field, 1, io.read(8).unpack1("Q<")
        when 2
          length = read_varint(io)
          chunk = io.read(length)
          raise FormatError, "truncated field #{field}" if chunk.nil? || chunk.bytesize != length

          yield field, 2, chunk
        when 5 then yield field, 5, io.read(4).unpack1("L<")
        else raise FormatError, "unsupported wire type #{key & 7} for field #{field}"
        end
      end
    end

    def read_varint(io)
      result = 0
      shift = 0
      loop do
        byte = io.getbyte or raise FormatError, "truncated varint"
        result |= (byte & 0x7f) << shift
        return result if byte < 0x80

        shift += 7
        raise FormatError, "varint too long" if shift > 63
      end
    end

    # int64 fields arrive as unsigned 64-bit two's complement.
    def signed(value)
      value >= INT64_LIMIT ? value - UINT64_RANGE : value
    end
    INT64_LIMIT = 2**63
    UINT64_RANGE = 2**64

    # Repeated scalar fields may be packed (wire type 2) or not.
    def scalars(wire_type, value)
      return [value] unless wire_type == 2

      io = StringIO.new(value)
      list = []
      list << read_varint(io) until io.eof?
      list
    end

    def fields_hash(bytes)
      hash = Hash.new(0)
      each_field(bytes) { |field, _wire, value| hash[field] = value }
      hash
    end

    def decode_profile(bytes)
      raw = { sample_type: [], sample: [], location: {}, function: {}, strings: [], comment: [],
              mappings: 0, time: 0, duration: 0, period_type: nil, period: 0, default: 0 }
      each_field(bytes) do |field, wire, value|
        case field
        when 1 then raw[:sample_type] << fields_hash(value)
        when 2 then raw[:sample] << decode_sample(value)
        when 3 then raw[:mappings] += 1
        when 4
          location = decode_location(value)
          raw[:location][location[:id]] = location
        when 5
          function = fields_hash(value)
          raw[:function][function[1]] = function
        when 6 then raw[:strings] << value.dup.force_encoding(Encoding::UTF_8)
        when 9 then raw[:time] = signed(value)
        when 10 then raw[:duration] = signed(value)
        when 11 then raw[:period_type] = fields_hash(value)
        when 12 then raw[:period] = signed(value)
        when 13 then raw[:comment].concat(scalars(wire, value))
        when 14 then raw[:default] = value
        end
      end
      build(raw)
    end

    def decode_sample(bytes)
      sample = { location_ids: [], values: [], labels: [] }
      each_field(bytes) do |field, wire, value|
        case field
        when 1 then sample[:location_ids].concat(scalars(wire, value))
        when 2 then sample[:values].concat(scalars(wire, value).map { |v| signed(v) })
        when 3 then sample[:labels] << fields_hash(value)
        end
      end
      sample
    end

    def decode_location(bytes)
      location = { id: 0, lines: [] }
      each_field(bytes) do |field, _wire, value|
        case field
        when 1 then location[:id] = value
        when 4 then location[:lines] << fields_hash(value)
        end
      end
      location
    end

    # The decoded fields to the structs in one pass, in the message's order.
    def build(raw) # rubocop:disable Metrics/AbcSize
      strings = raw[:strings]
      str = ->(index) { strings.fetch(index) { raise FormatError, "string index #{index} out of range" } }
      functions = raw[:function].transform_values do |f|
        Function.new(f[1], str[f[2]], str[f[3]], str[f[4]], signed(f[5]))
      end
      # Each location's frames are made once and shared by every sample
      # that lists it.
      location_frames = Hash.new do |frames_of, id|
        location = raw[:location].fetch(id) { raise FormatError, "unknown location #{id}" }
        frames_of[id] = location[:lines].map do |line|
          function = functions.fetch(line[1]) { raise FormatError, "unknown function #{line[1]}" }
          Frame.new(function.name, function.filename, signed(line[2]), function.start_line).freeze
        end
      end
      samples = raw[:sample].map do |s|
        frames = s[:location_ids].flat_map { |id| location_frames[id] }
        labels = s[:labels].map { |l| Label.new(str[l[1]], str[l[2]], signed(l[3]), str[l[4]]) }
        Sample.new(frames, s[:values], labels)
      end
      period_type = raw[:period_type] && ValueType.new(str[raw[:period_type][1]], str[raw[:period_type][2]])
      Profile.new(
        raw[:sample_type].map { |t| ValueType.new(str[t[1]], str[t[2]]) },
        samples, functions.values, strings, raw[:time], raw[:duration], period_type, raw[:period],
        raw[:comment].map { |i| str[i] }, str[raw[:default]], raw[:mappings], raw[:location].size
      )
    end
  end
end
