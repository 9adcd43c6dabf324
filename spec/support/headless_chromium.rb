# frozen_string_literal: true

require "json"
require "tmpdir"
require "fileutils"
require "io/nonblock"
require "io/wait"
require "uri"
require "zlib"

# A tiny Chrome DevTools Protocol client for the browser specs. It starts
# headless Chromium with --remote-debugging-pipe: Chromium reads JSON
# commands, each ended by a NUL byte, from its fd 3, and writes replies and
# events the same way to its fd 4. Every wait has a timeout, and the browser
# and its temporary profile are always removed.
#
#   HeadlessChromium.open("/tmp/page.html") do |page|
#     page.evaluate("document.title")          # => "..."
#     page.click(120, 80)                      # a real left click
#     page.screenshot("/tmp/shot.png")
#     page.requests                            # => URLs the page fetched
#   end
module HeadlessChromium
  class Error < StandardError; end

  TIMEOUT = 20 # seconds, for every wait

  # Chromium's path: $CHROMIUM, or the first of the usual names on $PATH;
  # nil when there is none.
  def self.executable
    if (path = ENV.fetch("CHROMIUM", nil))
      return File.file?(path) && File.executable?(path) ? path : nil
    end

    %w[chromium chromium-browser google-chrome].each do |name|
      ENV.fetch("PATH", "").split(File::PATH_SEPARATOR).each do |dir|
        path = File.join(dir, name)
        return path if File.file?(path) && File.executable?(path)
      end
    end
    nil
  end

  # Opens `target` (a file path or a URL) in a fresh headless Chromium,
  # yields its Page, and stops the browser when the block ends.
  def self.open(target, width: 1280, height: 900, timeout: TIMEOUT)
    browser = Browser.new(width: width, height: height, timeout: timeout)
    yield browser.open_page(target)
  ensure
    browser&.close
  end

  # One browser process and the pipes to it.
  class Browser
    def initialize(width:, height:, timeout:)
      executable = HeadlessChromium.executable or
        raise Error, "Chromium not found: run script/bootstrap (or set CHROMIUM)"
      @timeout = timeout
      @dir = Dir.mktmpdir("headless-chromium")
      @log = File.join(@dir, "chromium.log")
      @buffer = String.new(encoding: Encoding::BINARY)
      @events = []
      @requests = []
      @next_id = 0
      commands_in, @commands = IO.pipe
      @replies, replies_out = IO.pipe
      # Ruby makes its pipes non-blocking; Chromium's ends must block, or its
      # first read with nothing to read fails and it drops the connection.
      commands_in.nonblock = false
      replies_out.nonblock = false
      @pid = Process.spawn(
        executable, "--headless", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu",
        "--user-data-dir=#{File.join(@dir, 'profile')}", "--no-first-run", "--no-default-browser-check",
        "--disable-extensions", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--hide-scrollbars", "--mute-audio", "--window-size=#{width},#{height}",
        "about:blank",
        3 => commands_in, 4 => replies_out, in: File::NULL, %i[out err] => [@log, "w"], pgroup: true
      )
      commands_in.close
      replies_out.close
      @commands.binmode
      @replies.binmode
    rescue StandardError
      close
      raise
    end

    # Attaches to a new tab, loads `target` in it and waits for its load event.
    def open_page(target)
      url = target.match?(/\A[a-z][a-z0-9+.-]*:/i) ? target : file_url(target)
      target_id = command("Target.createTarget", { url: "about:blank" })["targetId"]
      session = command("Target.attachToTarget", { targetId: target_id, flatten: true })["sessionId"]
      page = Page.new(self, session, url)
      page.command("Page.enable")
      page.command("Network.enable")
      @events.reject! { |m| m["method"] == "Page.loadEventFired" } # about:blank's
      navigation = page.command("Page.navigate", url: url)
      raise Error, "cannot open #{url}: #{navigation['errorText']}" if navigation["errorText"]

      wait_for_event("the load event of #{url}") do |m|
        m["method"] == "Page.loadEventFired" && m["sessionId"] == session
      end
      page
    end

    # Sends a command and returns its result (raises on a protocol error).
    def command(method, params = {}, session: nil)
      id = (@next_id += 1)
      message = { id: id, method: method, params: params }
      message[:sessionId] = session if session
      begin
        @commands.write("#{JSON.generate(message)}\0")
        @commands.flush
      rescue Errno::EPIPE, IOError
        raise Error, "Chromium is gone, cannot send #{method}#{log_tail}"
      end
      reply = wait_for("the reply to #{method}") { |m| m["id"] == id }
      raise Error, "#{method} failed: #{reply['error']['message']}" if reply["error"]

      reply["result"]
    end

    # The first event, already received or not, for which the block is true.
    def wait_for_event(description, &match)
      index = @events.index(&match)
      return @events.delete_at(index) if index

      wait_for(description, &match)
    end

    # URLs requested in a session so far (from Network.requestWillBeSent).
    def requests(session)
      @requests.select { |r| r[:session] == session }.map { |r| r[:url] }
    end

    def close
      @commands&.close unless @commands&.closed?
      stop_process if @pid
    ensure
      @replies&.close unless @replies&.closed?
      FileUtils.rm_rf(@dir) if @dir
    end

    private

    # Reads messages until one passes the block; keeps the events it skips.
    def wait_for(description)
      deadline = now + @timeout
      loop do
        message = read_message(deadline, description)
        return message if yield(message)

        @events << message if message["method"]
      end
    end

    def read_message(deadline, description)
      until (nul = @buffer.index("\0"))
        remaining = deadline - now
        raise Error, "timed out after #{@timeout} s waiting for #{description}#{log_tail}" if remaining <= 0
        next unless @replies.wait_readable(remaining)

        chunk = @replies.read_nonblock(1 << 16, exception: false)
        next if chunk == :wait_readable
        raise Error, "Chromium exited while waiting for #{description}#{log_tail}" if chunk.nil?

        @buffer << chunk
      end
      message = JSON.parse(@buffer.slice!(0, nul + 1).chop.force_encoding(Encoding::UTF_8))
      if message["method"] == "Network.requestWillBeSent"
        @requests << { session: message["sessionId"], url: message.dig("params", "request", "url") }
      end
      message
    end

    # TERM to the whole process group (Chromium's helpers too), KILL what is
    # left after 5 s.
    def stop_process
      signal_group("TERM")
      deadline = now + 5
      until (reaped = Process.wait(@pid, Process::WNOHANG)) || now > deadline
        sleep 0.05
      end
      signal_group("KILL")
      Process.wait(@pid) unless reaped
    rescue Errno::ECHILD
      nil
    ensure
      @pid = nil
    end

    def signal_group(signal)
      Process.kill(signal, -@pid)
    rescue Errno::ESRCH, Errno::EPERM
      nil
    end

    def file_url(path)
      "file://#{URI::DEFAULT_PARSER.escape(File.expand_path(path))}"
    end

    def log_tail
      return "" unless @log && File.exist?(@log)

      tail = File.readlines(@log).last(15).join
      tail.empty? ? "" : "\nChromium's output (last lines):\n#{tail}"
    end

    def now
      Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end
  end

  # A tab, through its flat-mode session.
  class Page
    attr_reader :url

    def initialize(browser, session, url)
      @browser = browser
      @session = session
      @url = url
    end

    def command(method, params = {})
      @browser.command(method, params, session: @session)
    end

    # The value of a JavaScript expression (awaited if it is a promise),
    # as JSON-able Ruby data; a JavaScript exception raises Error.
    def evaluate(expression)
      result = command("Runtime.evaluate", expression: expression, returnByValue: true, awaitPromise: true)
      if (details = result["exceptionDetails"])
        raise Error, "JavaScript error: #{details.dig('exception', 'description') || details['text']}"
      end

      result.dig("result", "value")
    end

    # A left click at viewport coordinates, as a user's: move, press, release.
    def click(x, y)
      command("Input.dispatchMouseEvent", type: "mouseMoved", x: x, y: y)
      %w[mousePressed mouseReleased].each do |type|
        command("Input.dispatchMouseEvent", type: type, x: x, y: y, button: "left", clickCount: 1)
      end
    end

    # Moves the mouse to viewport coordinates (hover).
    def hover(x, y)
      command("Input.dispatchMouseEvent", type: "mouseMoved", x: x, y: y)
    end

    # Types `text` into the element `selector` (focused first), as a user's
    # keyboard input would: it fires input events.
    def type(selector, text)
      evaluate("document.querySelector(#{JSON.generate(selector)}).focus()")
      command("Input.insertText", text: text)
    end

    # Saves a PNG of the viewport; returns the path.
    def screenshot(path)
      data = command("Page.captureScreenshot", format: "png")["data"]
      File.binwrite(path, data.unpack1("m"))
      path
    end

    # URLs the page requested, other than the page itself.
    def requests
      @browser.requests(@session).reject { |u| u == @url }
    end
  end

  # Just enough of PNG to look at the pixels of a screenshot: 8-bit RGB or
  # RGBA, not interlaced (what Chromium writes).
  module Png
    Image = Struct.new(:width, :height, :channels, :rows, keyword_init: true) do
      # [r, g, b] of every pixel, row by row.
      def pixels
        rows.flat_map { |row| row.each_slice(channels).map { |px| px.first(3) } }
      end
    end

    def self.read(path)
      data = File.binread(path)
      raise Error, "#{path} is not a PNG" unless data.start_with?("\x89PNG\r\n\x1a\n".b)

      header, idat = chunks(data)
      width, height, depth, color, _compression, _filter, interlace = header.unpack("NNCCCCC")
      channels = { 2 => 3, 6 => 4 }[color]
      unless depth == 8 && channels && interlace.zero?
        raise Error, "unsupported PNG (bit depth #{depth}, color type #{color}, interlace #{interlace})"
      end

      Image.new(width: width, height: height, channels: channels,
                rows: unfilter(Zlib::Inflate.inflate(idat), width * channels, height, channels))
    end

    def self.chunks(data)
      offset = 8
      header = nil
      idat = String.new(encoding: Encoding::BINARY)
      while offset < data.bytesize
        length, type = data.unpack("Na4", offset: offset)
        body = data.byteslice(offset + 8, length)
        header = body if type == "IHDR"
        idat << body if type == "IDAT"
        offset += 12 + length
      end
      [header, idat]
    end

    # Undoes PNG's per-row filters (None, Sub, Up, Average, Paeth).
    def self.unfilter(raw, stride, height, bpp)
      previous = Array.new(stride, 0)
      Array.new(height) do |y|
        filter = raw.getbyte(y * (stride + 1))
        row = raw.byteslice(y * (stride + 1) + 1, stride).bytes
        stride.times do |i|
          left = i >= bpp ? row[i - bpp] : 0
          up = previous[i]
          predicted =
            case filter
            when 0 then 0
            when 1 then left
            when 2 then up
            when 3 then (left + up) >> 1
            when 4 then paeth(left, up, i >= bpp ? previous[i - bpp] : 0)
            else raise Error, "bad PNG filter #{filter}"
            end
          row[i] = (row[i] + predicted) & 0xff
        end
        previous = row
      end
    end

    def self.paeth(left, up, up_left)
      estimate = left + up - up_left
      distances = [(estimate - left).abs, (estimate - up).abs, (estimate - up_left).abs]
      return left if distances[0] <= distances[1] && distances[0] <= distances[2]

      distances[1] <= distances[2] ? up : up_left
    end
  end
end
