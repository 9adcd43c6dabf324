# frozen_string_literal: true

require "uri"

module MemprofilerPprof
  # Pyroscope server addresses, which may carry credentials
  # (https://user:token@host): where they end for connecting (`split`), and
  # what of an address may be shown (`redact`). Users paste tokens
  # unencoded, so the part before the host may hold '/', '#', '?', '@' and
  # '%'; every message, log line and #inspect that shows an address goes
  # through `redact`.
  module PyroscopeAddress
    FILTERED = "[FILTERED]"
    SCHEME = %r{\A[A-Za-z][A-Za-z0-9+.\-]*://}n

    module_function

    # The address for a message: everything between "scheme://" (the start,
    # without one) and the LAST '@' becomes [FILTERED], whatever it holds.
    # No host can hold an '@', so nothing of the credentials can be left
    # after it; an '@' further on (a path's, a query's) hides more than
    # needed, never less.
    def redact(address)
      text = address.to_s
      bytes = text.b
      start = bytes[SCHEME]&.bytesize || 0
      at = bytes.rindex("@")
      return text if at.nil? || at < start

      "#{bytes.byteslice(0, start)}#{FILTERED}#{bytes.byteslice(at..)}".force_encoding(text.encoding)
    end

    # [address without credentials, user, password] of
    # "scheme://user:password@host...", user and password nil without
    # credentials. A URL that parses is read as one (%XX decoded, '+'
    # kept). One that does not (a token holding '/', '#', '?', '@' or a
    # stray '%') has its credentials end at the first '@' after which the
    # rest is a URL with a host and no credentials of its own. Without
    # "scheme://", everything up to the last '@' is taken off.
    #
    # An '@' may still be left in the address returned (in a path or
    # query, or a token the parser read as a port or a host): the uploader
    # refuses such an address, as either reading could be meant.
    def split(address)
      address = address.to_s
      begin
        uri = URI.parse(address)
        if uri.host
          return [address, nil, nil] unless uri.userinfo

          # The userinfo as written sits right after "//" (URI#userinfo=
          # cannot remove it).
          start = address.index("//") + 2
          stripped = address[0, start] + address[(start + uri.userinfo.size + 1)..]
          return [stripped, percent_decode(uri.user.to_s), percent_decode(uri.password.to_s)]
        end
      rescue URI::InvalidURIError
        nil
      end
      tolerant_split(address)
    end

    # In bytes: an address may not be valid UTF-8.
    def tolerant_split(address)
      bytes = address.b
      scheme = bytes[SCHEME]
      at = bytes.rindex("@")
      return [address, nil, nil] unless at && at >= (scheme&.size || 0)

      rest_of = ->(i) { "#{scheme}#{bytes[(i + 1)..]}".force_encoding(address.encoding) }
      return [rest_of[at], "", ""] unless scheme

      ends = (scheme.size...bytes.size).select { |i| bytes.getbyte(i) == 0x40 } # '@'
      cut = ends.find { |i| clean_url?(rest_of[i]) } || at
      user, password = bytes[scheme.size...cut].split(":", 2)
      [rest_of[cut], percent_decode(user.to_s), percent_decode(password.to_s)]
    end
    private_class_method :tolerant_split

    # A URL with a host and no credentials.
    def clean_url?(text)
      uri = URI.parse(text)
      !uri.host.to_s.empty? && uri.userinfo.nil?
    rescue URI::InvalidURIError
      false
    end
    private_class_method :clean_url?

    def percent_decode(text)
      text.b.gsub(/%\h\h/n) { |escape| escape[1, 2].hex.chr }.force_encoding(Encoding::UTF_8)
    end
    private_class_method :percent_decode
  end
end
