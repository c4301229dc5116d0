# frozen_string_literal: true

require "io/nonblock"
require "json"
require "timeout"

# Headless Chromium driven through its DevTools protocol over a pipe, with no gem: started with
# --remote-debugging-pipe, it reads commands on fd 3 and writes replies and events on fd 4, each
# one JSON message followed by a NUL byte. Enough of the protocol to open a page, click at a point,
# type and evaluate JavaScript: the HTML specs use it to use a page as a person would.
class DevtoolsPipe
  TIMEOUT = 30

  attr_reader :log

  # `browser`: the chromium command and its flags (without a URL).
  def initialize(browser, log_path)
    commands_in, @commands = IO.pipe
    @replies, replies_out = IO.pipe
    @log = log_path
    # Ruby opens pipes non-blocking; Chromium reads and writes its ends as blocking ones (a read
    # that would block ends its pipe connection).
    commands_in.nonblock = false
    replies_out.nonblock = false
    @pid = Process.spawn(*browser, "--remote-debugging-pipe", "about:blank",
      3 => commands_in, 4 => replies_out, :out => log_path, :err => log_path, :pgroup => true)
    commands_in.close
    replies_out.close
    @id = 0
    @buffer = +""
  end

  # Opens `url` in a new tab and waits until `ready` (a JavaScript expression) is true; returns self.
  def open(url, ready: "document.readyState === 'complete'", before: nil)
    target = call("Target.createTarget", {url: "about:blank"})["targetId"]
    @session = call("Target.attachToTarget", {targetId: target, flatten: true})["sessionId"]
    call("Page.enable", {}, session: @session)
    call("Page.addScriptToEvaluateOnNewDocument", {source: before}, session: @session) if before
    call("Page.navigate", {url: url}, session: @session)
    wait_for(ready)
    self
  end

  # The value of the JavaScript `expression` in the page (JSON-able values only).
  def eval(expression)
    result = call("Runtime.evaluate", {expression: expression, returnByValue: true, awaitPromise: true}, session: @session)
    raise "#{expression}: #{result["exceptionDetails"].inspect}" if result["exceptionDetails"]

    result.dig("result", "value")
  end

  def wait_for(expression)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + TIMEOUT
    until eval("!!(#{expression})")
      raise "timed out waiting for #{expression}" if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

      sleep 0.05
    end
  end

  # A left click at the page's point (x, y), as the mouse makes it: move, press, release.
  def click(x, y)
    %w[mouseMoved mousePressed mouseReleased].each do |type|
      call("Input.dispatchMouseEvent", {type: type, x: x, y: y, button: "left", clickCount: type == "mouseMoved" ? 0 : 1},
        session: @session)
    end
  end

  # Types `text` into the focused element, as a keyboard (or an input method) would.
  def type(text)
    call("Input.insertText", {text: text}, session: @session)
  end

  def close
    begin
      call("Browser.close") if @pid
    rescue StandardError
      nil
    end
    @commands.close unless @commands.closed?
    begin
      Timeout.timeout(10) { Process.wait(@pid) }
    rescue Timeout::Error
      Process.kill("KILL", -@pid)
      Process.wait(@pid)
    end
    @pid = nil
  end

  private

  def call(method, params = {}, session: nil)
    @id += 1
    message = {id: @id, method: method, params: params}
    message[:sessionId] = session if session
    @commands.write(JSON.generate(message), "\0")
    @commands.flush
    loop do
      reply = read_message
      next unless reply["id"] == @id # an event: not needed here
      raise "#{method}: #{reply["error"].inspect}" if reply["error"]

      return reply["result"]
    end
  end

  def read_message
    until (at = @buffer.index("\0"))
      raise "chromium did not answer in #{TIMEOUT} s (log: #{File.read(@log)[-2000..]})" unless IO.select([@replies], nil, nil, TIMEOUT)

      @buffer << @replies.readpartial(1 << 16)
    end
    JSON.parse(@buffer.slice!(0..at).chop)
  end
end
