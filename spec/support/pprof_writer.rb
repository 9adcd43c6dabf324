# frozen_string_literal: true

require "zlib"
require "stringio"

# Writes small pprof profiles with exactly the samples a spec asks for, so
# reports on them (top, diff) are the same bytes on every Ruby and machine:
# what golden files need. A minimal protobuf encoder for profile.proto.
module PprofWriter
  module_function

  # sample_types: [["inuse_space", "bytes"], ...]
  # samples: [{ stack: [[name, file, line, start_line], ...] (leaf first),
  #             values: [...], class: "String" or nil }, ...]
  # The fields in the message's order, in one place: the order strings are
  # interned in is the output's string table.
  def build(sample_types:, samples:, time_nanos: 0, duration_nanos: 0, period: 0, # rubocop:disable Metrics/AbcSize
            period_type: nil, comments: [], default_sample_type: nil, class_key: "class", gzip: true)
    strings = [""]
    string_ids = { "" => 0 }
    intern = lambda do |s|
      string_ids[s] ||= (strings << s).size - 1
    end
    functions = {}
    locations = {}
    out = +"".b
    sample_types.each { |type, unit| out << message(1, field_varint(1, intern[type]) + field_varint(2, intern[unit])) }
    sample_messages = samples.map do |sample|
      ids = sample.fetch(:stack).map do |name, file, line, start_line|
        function_key = [name, file, start_line || 0]
        function_id = functions[function_key] ||= functions.size + 1
        locations[[function_id, line]] ||= locations.size + 1
      end
      body = packed(1, ids) + packed(2, sample.fetch(:values))
      body << message(3, field_varint(1, intern[class_key]) + field_varint(2, intern[sample[:class]])) if sample[:class]
      message(2, body)
    end
    sample_messages.each { |m| out << m }
    locations.each do |(function_id, line), id|
      line_message = field_varint(1, function_id) + field_varint(2, line)
      out << message(4, field_varint(1, id) + message(4, line_message))
    end
    functions.each do |(name, file, start_line), id|
      body = field_varint(1, id) + field_varint(2, intern[name]) + field_varint(4, intern[file]) +
             field_varint(5, start_line)
      out << message(5, body)
    end
    comment_ids = comments.map { |c| intern[c] }
    default_id = default_sample_type ? intern[default_sample_type] : 0
    period_type_ids = period_type&.map { |s| intern[s] }
    strings.each { |s| out << message(6, s.b) }
    out << field_varint(9, time_nanos) << field_varint(10, duration_nanos)
    out << message(11, field_varint(1, period_type_ids[0]) + field_varint(2, period_type_ids[1])) if period_type_ids
    out << field_varint(12, period)
    comment_ids.each { |id| out << field_varint(13, id) }
    out << field_varint(14, default_id)
    gzip ? gzip(out) : out
  end

  def gzip(bytes)
    io = StringIO.new(+"".b)
    writer = Zlib::GzipWriter.new(io)
    writer.mtime = 1 # same bytes every run
    writer.write(bytes)
    writer.finish
    io.string
  end

  def varint(n)
    n += 1 << 64 if n.negative?
    bytes = +"".b
    loop do
      byte = n & 0x7f
      n >>= 7
      if n.zero?
        bytes << byte
        return bytes
      end
      bytes << (byte | 0x80)
    end
  end

  def field_varint(field, value)
    value.zero? ? +"".b : varint(field << 3) + varint(value)
  end

  def message(field, body)
    varint((field << 3) | 2) + varint(body.bytesize) + body
  end

  def packed(field, values)
    message(field, values.map { |v| varint(v) }.join.b)
  end
end
