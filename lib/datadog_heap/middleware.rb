# frozen_string_literal: true

require "digest"
require "ipaddr"
require "stringio"
require "uri"
require "datadog_heap"

module DatadogHeap
  # A Rack middleware that serves the live heap on demand, as Go programs serve /debug/pprof/heap:
  #
  #   use DatadogHeap::Middleware                                  # config.ru; loopback clients only
  #   use DatadogHeap::Middleware, token: ENV["HEAP_TOKEN"]        # any client with the bearer token
  #
  #   curl -o heap.pb.gz http://127.0.0.1:9292/debug/heap          # gzip pprof of the live heap
  #   curl 'http://127.0.0.1:9292/debug/heap?report=1&top=20'      # the text of `datadog-heap report`
  #   open 'http://127.0.0.1:9292/debug/heap?html=1'               # the page of `datadog-heap report --html`
  #
  # It is off unless added: nothing else serves the heap. Requests to any other path go to the app
  # untouched. Who may read the heap (docs/http-endpoint.md says what each mode protects against):
  # - without `token:` (loopback mode), only a request made on this host straight to the server:
  #   from a loopback address (127.0.0.0/8, ::1), for a loopback name (a Host of localhost,
  #   127.x.x.x or [::1], any port, or no Host header at all), carrying no header a proxy adds
  #   (Forwarded, X-Forwarded-*, Via, X-Real-IP, CF-Connecting-IP, True-Client-IP, X-Client-IP...).
  #   A client at another address gets 404, as if nothing were here. A loopback client with any
  #   other Host (a web page reaching this port through DNS rebinding) or a forwarding header (a
  #   proxy on this host, which makes every client look local) gets 403 saying why and how to set
  #   a token; nothing of the request is echoed.
  # - with `token:`, any client sending `Authorization: Bearer <token>`, compared in constant time;
  #   others get 403. Host and proxy headers are not looked at.
  # Only GET (405 otherwise). Query: `report=1` (text instead of pprof), `html=1` (the HTML page
  # of `datadog-heap report --html` instead: flame graph, top sites and classes, facts and notes;
  # served with a Content-Security-Policy that allows its one inline script and style, by hash,
  # and nothing else), `top=N` (1 to 1000, default 10), `by=size|count` and
  # `group=site|location|file|gem|class` (as `datadog-heap report --by/--group`), `wide=1` (full
  # paths, rows uncut), `gc=1` (a full GC first, so garbage not yet collected is not listed; the
  # default is the recorder's preset's, see Recorder#gc_before_profile?; the profile's notes say
  # whether one ran), `retainers=1` (retainer paths, hash keys shown by class and size; default:
  # the preset's), `retainers=values` (paths with keys as they are: they may hold the program's
  # data, docs/http-endpoint.md). Every flag takes 1 or true, 0 or false. The query is strict: an unknown parameter, one given twice, a bad
  # value, or a report option (top, by, group, wide, workers) without report=1 or html=1 gets a
  # 400 naming it and what is accepted. The endpoint's own allocations are never sampled.
  #
  # In a cluster (puma workers, unicorn) each connection reaches one worker. With `workers_dir:`
  # and `workers_max_age:` (the Railtie passes its `output` and WorkersView.max_age_for(its
  # `interval`)), `?workers=1&report=1` (or `&html=1`) reports the sum of this worker's heap now
  # and, for each other worker, the newest profile it wrote there (`heap-<pid>-<n>.pb.gz`, as auto
  # mode and the Railtie name them), by modification time. A file is taken only when its process
  # runs as this one's user (`kill(0)` succeeds: EPERM means another user's process, not ours) and
  # it was written less than `workers_max_age` seconds ago (older ones are left by a process that
  # stopped writing, or by an earlier run whose pid was reused). The report's notes list every
  # file taken and every file skipped, with why (see WorkersView). The profile is the
  # process-wide recorder's (DatadogHeap.start, auto mode, the Railtie) unless `recorder:` names
  # another; 503 while there is none. Building a profile runs a full update under the GVL (see
  # Recorder#profile), so requests are served one at a time. Nothing here raises into the server:
  # a failure is a 500 naming it.
  class Middleware
    DEFAULT_PATH = "/debug/heap"
    MAX_TOP = 1000
    # Rack env keys of the headers proxies add to say who the client is or that they passed the
    # request on; every HTTP_X_FORWARDED_* key counts too (FORWARDED_PREFIX).
    FORWARDING_HEADERS = %w[HTTP_FORWARDED HTTP_VIA HTTP_X_REAL_IP HTTP_CF_CONNECTING_IP HTTP_TRUE_CLIENT_IP
      HTTP_X_CLIENT_IP HTTP_X_CLUSTER_CLIENT_IP HTTP_FASTLY_CLIENT_IP HTTP_X_ORIGINAL_FORWARDED_FOR
      HTTP_X_ENVOY_EXTERNAL_ADDRESS].freeze
    FORWARDED_PREFIX = /\AHTTP_X_FORWARDED(?:_|\z)/
    # A Host header naming this host on the loopback: the name and an optional port.
    HOST = /\A(localhost|\d{1,3}(?:\.\d{1,3}){3}|\[[0-9a-f:.]+\])(?::\d{1,5})?\z/i
    TOKEN_HINT = "To serve it anyway, give the endpoint a token (DatadogHeap::Middleware's token:, or " \
      "config.datadog_heap.endpoint_token in Rails) and send `Authorization: Bearer <token>`."
    PROXIED = "datadog_heap: refused: this request carries a proxy's forwarding header (X-Forwarded-For, " \
      "Forwarded, Via...), and without a token the heap is served only to requests made straight to the " \
      "server from this host. #{TOKEN_HINT}\n"
    FOREIGN_HOST = "datadog_heap: refused: without a token the heap is served only to requests for localhost, " \
      "127.0.0.1 or [::1] (any port); a web page can reach this port under a name of its own (DNS rebinding). " \
      "#{TOKEN_HINT}\n"
    # The query parameters the endpoint takes; FLAGS take 1/true or 0/false; REPORT_OPTIONS shape
    # the report, so they need report=1 or html=1.
    PARAMETERS = %w[report html top by group wide gc retainers workers].freeze
    FLAGS = %w[report html wide gc retainers workers].freeze
    FLAG_VALUES = {"1" => true, "true" => true, "0" => false, "false" => false}.freeze
    REPORT_OPTIONS = %w[top by group wide workers].freeze
    BY = %w[size count].freeze

    # A query parameter the endpoint cannot use; answered with 400.
    class BadRequest < StandardError; end

    # Where the endpoint answers (the `path:` given to #initialize).
    attr_reader :path

    # `path`: where the endpoint answers (a String starting with "/"). `token`: nil (loopback
    # clients only) or the bearer token clients must send (a non-empty String). `recorder`: nil
    # (DatadogHeap.recorder at each request) or a DatadogHeap::Recorder.
    # `workers_dir`: nil, or the directory the cluster's workers write their profiles to;
    # `workers_max_age`: nil, or the age in seconds past which a worker's file is stale (a few of
    # the writer's intervals: WorkersView.max_age_for). `?workers=1` needs both.
    def initialize(app, path: DEFAULT_PATH, token: nil, recorder: nil, workers_dir: nil, workers_max_age: nil)
      @app = app
      @workers_dir = NilClass === workers_dir ? nil : Validate.path!(:workers_dir, workers_dir)
      @workers_max_age = if NilClass === workers_max_age
        nil
      else
        Validate.positive_number!(:workers_max_age, workers_max_age, WorkersView::MAX_AGE_LIMIT)
      end
      @path = self.class.check_path(path)
      @token_digest = NilClass === (token = self.class.check_token(token)) ? nil : Digest::SHA256.digest(token)
      unless NilClass === recorder || Recorder === recorder
        raise TypeError, "recorder must be a DatadogHeap::Recorder or nil, got #{Validate.describe(recorder)}"
      end
      @recorder = recorder
      @lock = Mutex.new
    end

    # The Rack call: answers a request for #path, hands any other to the app.
    def call(env)
      return @app.call(env) unless env["PATH_INFO"] == @path

      serve(env)
    end

    class << self
      # `path` checked as the endpoint's place (a String starting with "/"), frozen: TypeError or
      # ArgumentError naming it otherwise. The Railtie checks its endpoint_path setting with it.
      def check_path(path)
        raise TypeError, "path must be a String, got #{Validate.describe(path)}" unless String === path
        unless path.start_with?("/") && !path.include?("\0") && path.length > 1
          raise ArgumentError, "path must start with \"/\" and name a path, got #{Validate.show(path)}"
        end

        path.dup.freeze
      end

      # `token` checked as a bearer token (nil, or a non-empty String without whitespace): TypeError
      # or ArgumentError otherwise, whose messages never show it.
      def check_token(token)
        return nil if NilClass === token
        raise TypeError, "token must be a String or nil, got a #{Validate.class_name(token)} (not shown: it is a secret)" unless String === token
        # The value itself is a secret: never shown.
        raise ArgumentError, "token must not be empty (nil: loopback clients only)" if token.strip.empty?
        raise ArgumentError, "token must not contain whitespace (it is sent as `Authorization: Bearer <token>`)" if token.match?(/\s/)

        token
      end

      # Whether `a` and `b` are the same String, in a time that does not depend on where they
      # differ or on their lengths: both are hashed first, then every byte of the digests is compared.
      def secure_compare(a, b)
        secure_compare_digests(Digest::SHA256.digest(a), Digest::SHA256.digest(b))
      end

      # Whether the digests `a` and `b` are equal, every byte compared whatever the first difference.
      def secure_compare_digests(a, b)
        return false unless a.bytesize == b.bytesize

        diff = 0
        a.bytes.zip(b.bytes) { |x, y| diff |= x ^ y }
        diff == 0
      end
    end

    private

    def serve(env)
      refused = refusal(env)
      return refused if refused
      return text(405, "datadog_heap: #{@path} answers GET only\n", "allow" => "GET") unless env["REQUEST_METHOD"] == "GET"

      query = parse_query(env["QUERY_STRING"].to_s)
      if query[:workers]
        raise BadRequest, "workers=1 needs a directory the workers write to (config.datadog_heap.output)" unless @workers_dir
        unless @workers_max_age
          raise BadRequest, "workers=1 needs to know how often the workers write, to tell their files from stale ones " \
            "(config.datadog_heap.interval; DatadogHeap::Middleware's workers_max_age:)"
        end
      end
      recorder = @recorder || DatadogHeap.recorder
      return text(503, "datadog_heap: not recording in this process (pid #{Process.pid}): DatadogHeap.start was never called\n") unless recorder

      retainers = query[:retainers].nil? ? recorder.retainers_by_default? : query[:retainers]
      bytes = @lock.synchronize { recorder.profile(gc: query[:gc], retainers: retainers || nil) }
      return DatadogHeap.own_work { report(bytes, query) } if query[:report] || query[:html]

      [200, {"content-type" => "application/octet-stream", "content-length" => bytes.bytesize.to_s,
        "content-disposition" => "attachment; filename=\"heap-#{Process.pid}.pb.gz\"", "cache-control" => "no-store"}, [bytes]]
    rescue BadRequest => e
      text(400, "datadog_heap: #{e.message}\n")
    rescue DatadogHeap::Error => e
      text(503, "datadog_heap: #{e.message}\n")
    rescue StandardError => e
      text(500, "datadog_heap: could not build the heap profile: #{e.class}: #{e.message}\n")
    end

    # The response refusing this client, or nil when it may read the heap.
    def refusal(env)
      if @token_digest
        given = env["HTTP_AUTHORIZATION"].to_s[/\ABearer[ \t]+(\S+)[ \t]*\z/i, 1]
        ok = given && self.class.secure_compare_digests(Digest::SHA256.digest(given), @token_digest)
        return ok ? nil : text(403, "Forbidden\n")
      end
      return text(404, "Not Found\n") unless loopback?(env["REMOTE_ADDR"])
      return text(403, PROXIED) if forwarded?(env)
      return text(403, FOREIGN_HOST) unless loopback_host?(env["HTTP_HOST"])

      nil
    end

    # Whether a proxy's header is in `env` (FORWARDING_HEADERS, any HTTP_X_FORWARDED_*).
    def forwarded?(env)
      return true if FORWARDING_HEADERS.any? { |key| env.key?(key) }

      env.each_key.any? { |key| String === key && FORWARDED_PREFIX.match?(key) }
    end

    # Whether `host` (the Host header, nil when the request has none) names this host on the
    # loopback. No Host header is taken as local: every browser sends one, so a request without
    # it does not come from a web page, and its address was checked to be a loopback one.
    def loopback_host?(host)
      return true if NilClass === host
      return false unless String === host && (m = HOST.match(host))

      name = m[1].downcase
      return true if name == "localhost"

      loopback?(name.delete_prefix("[").delete_suffix("]"))
    end

    def loopback?(address)
      return false unless String === address && !address.empty?

      ip = IPAddr.new(address)
      ip = ip.native if ip.ipv6?
      ip.loopback?
    rescue IPAddr::Error
      false
    end

    # The query as {report:, html:, top:, by:, group:, wide:, gc:, retainers:, workers:}, gc and
    # retainers nil when not given. Raises BadRequest naming a parameter the endpoint does not
    # take, one given twice, a bad value, or a report option without a report.
    def parse_query(string)
      pairs = begin
        URI.decode_www_form(string)
      rescue ArgumentError => e
        raise BadRequest, "the query string is not valid: #{e.message}"
      end
      params = {}
      pairs.each do |name, value|
        unless PARAMETERS.include?(name)
          raise BadRequest, "unknown parameter #{Validate.show(name)}: the endpoint takes #{PARAMETERS.join(", ")} " \
            "(docs/http-endpoint.md)"
        end
        raise BadRequest, "#{name} is given more than once: give it once" if params.key?(name)

        params[name] = value
      end
      query = {report: flag(params, "report", false), html: flag(params, "html", false), top: top(params["top"]),
               by: choice(params, "by", BY, "size"), group: choice(params, "group", Profile::GROUPS.map(&:to_s), "site"),
               wide: flag(params, "wide", false), gc: flag(params, "gc", nil),
               retainers: (params["retainers"] == "values") ? {values: true} : flag(params, "retainers", nil),
               workers: flag(params, "workers", false)}
      raise BadRequest, "report=1 and html=1 ask for two formats: pick one" if query[:report] && query[:html]
      unless query[:report] || query[:html]
        given = REPORT_OPTIONS.find { |name| params.key?(name) }
        if given
          raise BadRequest, "#{given}= shapes the report: it needs report=1 or html=1 (without them the endpoint " \
            "serves this process's pprof#{", and each worker's pprof is in its own files" if given == "workers"})"
        end
      end
      query
    end

    def flag(params, name, default)
      value = params[name]
      return default if value.nil?
      return FLAG_VALUES[value] if FLAG_VALUES.key?(value)

      also = (name == "retainers") ? " (or values, for hash keys as they are)" : ""
      raise BadRequest, "#{name} must be 1 or true, 0 or false, got #{Validate.show(value)}#{also}"
    end

    def top(value)
      return Report::DEFAULT_TOP if value.nil?

      n = value.match?(/\A\d{1,4}\z/) ? Integer(value, 10) : nil
      return n if n&.between?(1, MAX_TOP)

      raise BadRequest, "top must be an Integer between 1 and #{MAX_TOP}, got #{Validate.show(value)}"
    end

    # by= and group=: one of `accepted`, as `datadog-heap report --by/--group` takes them.
    def choice(params, name, accepted, default)
      value = params.fetch(name, default)
      return value.to_sym if accepted.include?(value)

      raise BadRequest, "#{name} must be #{accepted[0..-2].join(", ")} or #{accepted[-1]} " \
        "(as `datadog-heap report --#{name}`), got #{Validate.show(value)}"
    end

    # The text report (report=1) or the HTML page (html=1) of the profile `bytes`.
    def report(bytes, query)
      profile = Profile.parse(bytes, path: "heap of pid #{Process.pid}")
      profile = WorkersView.new(@workers_dir, max_age: @workers_max_age).sum(profile) if query[:workers]
      out = StringIO.new
      writer = Report::Writer.new(out)
      options = {top: query[:top], by: query[:by], group: query[:group], wide: query[:wide]}
      unless query[:html]
        writer.write_report(profile, **options)
        return text(200, out.string)
      end

      writer.write_html_report(profile, **options)
      [200, {"content-type" => "text/html; charset=utf-8", "content-length" => out.string.bytesize.to_s,
        "cache-control" => "no-store", "content-security-policy" => ReportHtml.content_security_policy,
        "x-content-type-options" => "nosniff"}, [out.string]]
    end

    def text(status, body, headers = {})
      [status, {"content-type" => "text/plain; charset=utf-8", "content-length" => body.bytesize.to_s,
        "cache-control" => "no-store"}.merge(headers), [body]]
    end
  end
end

require "datadog_heap/report/writer"
require "datadog_heap/report/report_html"
require "datadog_heap/workers_view"
