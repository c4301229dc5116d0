# frozen_string_literal: true

require "datadog_heap"

module DatadogHeap
  # Keeps secrets out of messages and inspect: the credentials of a URL (`scheme://user:pass@`)
  # and tokens. Nothing here prints a secret it was given.
  module Redact
    # The userinfo of every URL in a text: from `scheme://` to the last `@` before the host's end.
    USERINFO = %r{([a-z][a-z0-9+.-]*://)[^/?#\s]*@}i
    SHOWN = "[redacted]"

    module_function

    # `text` with the userinfo of every URL in it, and every one of `secrets` (Strings, nil
    # ignored), replaced by [redacted].
    def text(text, *secrets)
      out = text.to_s.gsub(USERINFO) { "#{$1}#{SHOWN}@" }
      secrets.each { |secret| out = out.gsub(secret, SHOWN) if String === secret && !secret.empty? }
      out
    end

    # Whether `url` carries userinfo (`user@`, `user:password@`).
    def userinfo?(url)
      /\A#{USERINFO}/o.match?(url)
    end
  end

  # Sends heap profiles to a backend: a Datadog agent (its profiling intake) or a Pyroscope server
  # (its pprof ingest). The HTTP is libdd-profiling's exporter, in the extension; see
  # src/exporter/ for the wire formats.
  #
  #   exporter = DatadogHeap::Exporter.new(backend: :agent, url: "http://localhost:8126",
  #                                        tags: ["service:shop", "env:prod"])
  #   exporter.enqueue_profile(recorder, since: start_ns)   # under the GVL, cheap
  #   exporter.flush                                        # without the GVL; blocks this thread only
  #   exporter.stats                                        # upload_* counters
  #
  # Profiles wait in a queue of at most `max_queue`; a full queue drops its oldest (counted in
  # `upload_dropped_queue_full`). A flush sends oldest first, each request bounded by `timeout`
  # seconds, and stops at the first that does not reach the backend; a profile is tried at most 3
  # times, and one the backend rejects (4xx other than 408/429) is dropped; both counted.
  class Exporter
    BACKENDS = %i[agent pyroscope].freeze
    DEFAULTS = {timeout: 10.0, max_queue: 4}.freeze
    MAX_TIMEOUT = 600
    MAX_QUEUE = 64

    class << self
      # backend: :agent or :pyroscope; url: the agent's base URL (http://, https:// or unix://)
      # or the Pyroscope server's, without credentials (see check_url); tags: ["key:value", ...];
      # app_name, auth_token, tenant_id: Pyroscope only. auth_token (printable ASCII) is sent as
      # `Authorization: Bearer <token>` and never shown in a message.
      def new(backend:, url:, tags: [], timeout: DEFAULTS[:timeout], max_queue: DEFAULTS[:max_queue],
        app_name: nil, auth_token: nil, tenant_id: nil)
        Validate.one_of!(:backend, backend, BACKENDS)

        string!(:url, url)
        check_url(:url, url)
        raise TypeError, "tags must be an Array of Strings, got #{tags.inspect}" unless tags.is_a?(Array) && tags.all?(String)
        raise TypeError, "timeout must be a Numeric, got #{timeout.inspect}" unless timeout.is_a?(Numeric)
        unless timeout.to_f.finite? && timeout > 0 && timeout <= MAX_TIMEOUT
          raise ArgumentError, "timeout must be more than 0 and at most #{MAX_TIMEOUT} seconds, got #{timeout}"
        end
        Validate.integer!(:max_queue, max_queue, 1, MAX_QUEUE)

        pyroscope = backend == :pyroscope
        {app_name: app_name, auth_token: auth_token, tenant_id: tenant_id}.each do |name, value|
          next if value.nil?
          unless pyroscope
            shown = name == :auth_token ? "an auth_token (not shown: it is a secret)" : "#{name}: #{value.inspect}"
            raise ArgumentError, "#{name} is for backend: :pyroscope only, got #{shown}"
          end

          string!(name, value)
        end
        raise ArgumentError, "app_name is required with backend: :pyroscope" if pyroscope && app_name.nil?
        unless auth_token.nil? || auth_token.match?(/\A[\x20-\x7e]*\z/)
          raise ArgumentError, "auth_token must be printable ASCII (it is sent as `Authorization: Bearer <token>`); " \
            "not shown: it is a secret"
        end

        begin
          _native_new(backend.to_s, url, app_name, auth_token, tenant_id, tags, timeout.to_f, max_queue, VERSION)
        rescue ArgumentError, TypeError, Error => e
          raise e.class, Redact.text(e.message, auth_token), e.backtrace
        end
      end

      # Raises ArgumentError naming `name` when `url` carries credentials (`user:password@`):
      # neither backend sends them (the agent takes none; Pyroscope takes auth_token), and a URL
      # holding them would show them in every message naming it. The URL is shown redacted.
      def check_url(name, url)
        return url unless Redact.userinfo?(url)

        raise ArgumentError, "#{name} must not carry credentials (user:password@), which are never sent: " \
          "for Pyroscope give the token as auth_token (PYROSCOPE_AUTH_TOKEN for datadog_heap/auto); the Datadog " \
          "agent takes none; got #{Redact.text(url)}"
      end

      private

      def string!(name, value)
        return if value.is_a?(String)

        shown = name == :auth_token ? "a #{Validate.class_name(value)} (not shown: it is a secret)" : Validate.describe(value)
        raise TypeError, "#{name} must be a String, got #{shown}"
      end
    end

    # Queues `recorder`'s live objects as a profile spanning `since` (nanoseconds since the epoch,
    # Integer) to now; returns the end, in the same unit, to pass as the next `since`. Runs the
    # recorder's full update (GVL held), encodes without the GVL.
    def enqueue_profile(recorder, since:)
      raise TypeError, "recorder must be a DatadogHeap::Recorder, got #{recorder.inspect}" unless recorder.is_a?(Recorder)
      raise TypeError, "since must be an Integer (nanoseconds since the epoch), got #{since.inspect}" unless since.is_a?(Integer)

      _native_enqueue_profile(recorder, since).first
    end

    # Queues a gzip pprof made elsewhere; start and end in nanoseconds since the epoch. Returns
    # whether that pushed the oldest queued profile out.
    def enqueue(pprof, start_ns:, end_ns:)
      raise TypeError, "pprof must be a String, got #{pprof.class}" unless pprof.is_a?(String)
      [[:start_ns, start_ns], [:end_ns, end_ns]].each do |name, value|
        raise TypeError, "#{name} must be an Integer, got #{value.inspect}" unless value.is_a?(Integer)
      end

      _native_enqueue(pprof, start_ns, end_ns)
    end

    # Sends what is queued; returns [sent, failure, message]: failure is nil, :timeout,
    # :connection, :http_status, :cancelled or :busy. Blocks the calling thread (GVL released)
    # for at most about `timeout` per profile sent plus one.
    def flush
      _native_flush
    end
  end

  # Uploads from `datadog_heap/auto`, configured by the environment (see docs/uploads.md):
  #
  # - DATADOG_HEAP_UPLOAD: `agent` (the Datadog agent from DD_TRACE_AGENT_URL, or DD_AGENT_HOST and
  #   DD_TRACE_AGENT_PORT, or its unix socket when that exists, or localhost:8126); an agent URL
  #   (http://, https://, unix://); `pyroscope:URL`, or `pyroscope` for PYROSCOPE_SERVER_ADDRESS
  #   (default http://localhost:4040).
  # - DD_SERVICE, DD_ENV, DD_VERSION, DD_TAGS: tags (Pyroscope: the app name and labels; the
  #   app name is PYROSCOPE_APPLICATION_NAME when set). PYROSCOPE_AUTH_TOKEN, PYROSCOPE_TENANT_ID.
  # - DATADOG_HEAP_UPLOAD_TIMEOUT: seconds one request may take (default 10).
  #
  # One warning per run of failures (and one when uploads work again); every failure and drop is
  # counted in #stats. A URL with credentials (`user:password@`) is refused (ArgumentError, see
  # Exporter.check_url); no message or inspect shows a credential or PYROSCOPE_AUTH_TOKEN.
  class Upload
    ENV_UPLOAD = "DATADOG_HEAP_UPLOAD"
    ENV_TIMEOUT = "DATADOG_HEAP_UPLOAD_TIMEOUT"
    AGENT_SOCKET = "/var/run/datadog/apm.socket"
    DEFAULT_AGENT_HOST = "localhost"
    DEFAULT_AGENT_PORT = 8126
    DEFAULT_PYROSCOPE = "http://localhost:4040"
    # Tag keys DD_SERVICE, DD_ENV and DD_VERSION own: DD_TAGS may not give them another value.
    UNIFIED_KEYS = %w[service env version].freeze

    class << self
      # An Upload for the environment, or nil when DATADOG_HEAP_UPLOAD is unset or invalid (warned).
      def from_env(env = ENV)
        value = env[ENV_UPLOAD]
        return nil if value.nil? || value.strip.empty?

        backend, url = target(value.strip, env)
        unless backend
          warn "datadog_heap: ignoring #{ENV_UPLOAD}=#{Redact.text(value).inspect}: expected agent, an agent URL " \
            "(http://, https://, unix://), pyroscope or pyroscope:URL; not uploading"
          return nil
        end
        new(backend, url, env)
      end

      # [backend, url] for a DATADOG_HEAP_UPLOAD value; nil when it is none of the forms.
      def target(value, env)
        case value
        when "agent" then [:agent, agent_url(env)]
        when %r{\A(https?|unix)://.} then [:agent, value]
        when "pyroscope" then [:pyroscope, present(env["PYROSCOPE_SERVER_ADDRESS"]) || DEFAULT_PYROSCOPE]
        when %r{\Apyroscope:(https?://.+)\z} then [:pyroscope, $1]
        end
      end

      # The agent as Datadog's tracers find it.
      def agent_url(env)
        url = present(env["DD_TRACE_AGENT_URL"])
        return url if url

        host = present(env["DD_AGENT_HOST"])
        port = present(env["DD_TRACE_AGENT_PORT"])
        return "unix://#{AGENT_SOCKET}" if host.nil? && port.nil? && File.socket?(AGENT_SOCKET)

        host ||= DEFAULT_AGENT_HOST
        host = "[#{host}]" if host.include?(":") && !host.start_with?("[")
        "http://#{host}:#{port || DEFAULT_AGENT_PORT}"
      end

      def present(value)
        value = value&.strip
        (value.nil? || value.empty?) ? nil : value
      end
    end

    attr_reader :backend, :url

    def initialize(backend, url, env = ENV)
      @backend = backend
      @url = url
      @env = env.to_h
      @failing = false
      @exporter = build_exporter
      @since = now_ns
    end

    # The tags every profile of this process carries.
    def tags
      dd = @env.slice("DD_SERVICE", "DD_ENV", "DD_VERSION").transform_values { |v| self.class.present(v) }.compact
      unified = {"service" => dd["DD_SERVICE"] || default_service, "env" => dd["DD_ENV"], "version" => dd["DD_VERSION"]}.compact
      user = (@env["DD_TAGS"] || "").split(/[,\s]+/).reject(&:empty?)
      user = user.reject { |t| unified.key?(t.split(":", 2).first) && t.include?(":") }
      user = user.reject { |t| t.start_with?(":") || t.end_with?(":") }
      tags = unified.map { |k, v| "#{k}:#{sanitize(v)}" } + user
      return tags if @backend == :pyroscope

      tags + [
        "language:ruby", "runtime:ruby", "runtime_engine:#{RUBY_ENGINE}", "runtime_version:#{RUBY_VERSION}",
        "pid:#{Process.pid}", "process_id:#{Process.pid}", "profiler_version:#{VERSION}"
      ]
    end

    # Queues the recorder's profile since the last one (or since this Upload began) and sends
    # what is queued. Warns once per run of failures; never raises a failure to send.
    def push(recorder)
      @since = @exporter.enqueue_profile(recorder, since: @since)
      flush
    end

    def flush
      sent, failure, message = @exporter.flush
      if failure && failure != :busy
        warn "datadog_heap: could not upload heap profiles to #{redact(@url)} (#{failure}): #{redact(message)}; " \
          "retrying at the next profile, without more warnings until one goes through" unless @failing
        @failing = true
      elsif sent > 0 && @failing
        warn "datadog_heap: uploading heap profiles to #{redact(@url)} again"
        @failing = false
      end
      [sent, failure, message]
    end

    def stats
      @exporter.stats
    end

    # Backend and URL only: the environment it was built from holds secrets.
    def inspect
      "#<#{self.class.name} backend=#{@backend.inspect} url=#{redact(@url).inspect}>"
    end

    # In a forked child: a new exporter (the parent's client belongs to the parent), nothing of
    # the parent's queue (the parent sends that), the child's pid in the tags.
    def after_fork
      @exporter = build_exporter
      @since = now_ns
      @failing = false
    end

    private

    def build_exporter
      opts = {backend: @backend, url: @url, tags: tags, timeout: timeout}
      if @backend == :pyroscope
        opts[:app_name] = sanitize(self.class.present(@env["PYROSCOPE_APPLICATION_NAME"]) ||
          self.class.present(@env["DD_SERVICE"]) || default_service).tr("{}=", "_")
        opts[:auth_token] = self.class.present(@env["PYROSCOPE_AUTH_TOKEN"])
        opts[:tenant_id] = self.class.present(@env["PYROSCOPE_TENANT_ID"])
      end
      Exporter.new(**opts)
    end

    def redact(text)
      Redact.text(text, self.class.present(@env["PYROSCOPE_AUTH_TOKEN"]))
    end

    def timeout
      value = @env[ENV_TIMEOUT]
      return Exporter::DEFAULTS[:timeout] if value.nil? || value.strip.empty?

      seconds = Float(value, exception: false)
      return seconds if seconds&.finite? && seconds > 0 && seconds <= Exporter::MAX_TIMEOUT

      warn "datadog_heap: ignoring #{ENV_TIMEOUT}=#{value.inspect}: expected seconds > 0 and <= " \
        "#{Exporter::MAX_TIMEOUT}; using #{Exporter::DEFAULTS[:timeout]}"
      Exporter::DEFAULTS[:timeout]
    end

    def default_service
      name = File.basename($PROGRAM_NAME.to_s)
      name.empty? ? "ruby" : name
    end

    def sanitize(value)
      value.to_s.gsub(/[,\s]/, "_")
    end

    def now_ns
      Process.clock_gettime(Process::CLOCK_REALTIME, :nanosecond)
    end
  end
end
