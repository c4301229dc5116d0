# frozen_string_literal: true

require "rails/railtie"
require "datadog_heap"

module DatadogHeap
  # Rails integration, loaded by `require "datadog_heap"` (Bundler.require) when Rails is. Off
  # until enabled, in config/application.rb, config/environments/*.rb or an initializer:
  #
  #   config.datadog_heap.enabled = true
  #   config.datadog_heap.sample_every = 1024            # mean allocations between samples (nil: the Recorder's)
  #   config.datadog_heap.sampler = :countdown           # or :windowed (nil: the Recorder's)
  #   config.datadog_heap.max_overhead = 0.01            # the overhead budget (nil: none; unset: the
  #                                                      # Recorder's, none when sample_every is set)
  #   config.datadog_heap.preset = :leak_hunt            # staging/local leak hunt (see Recorder)
  #   config.datadog_heap.output = Rails.root.join("tmp/heap")  # heap-<pid>-<n>.pb.gz files (nil: none)
  #   config.datadog_heap.interval = 60                  # seconds between two profiles (nil: at exit only)
  #   config.datadog_heap.upload = "agent"               # as DATADOG_HEAP_UPLOAD (nil: no upload)
  #   config.datadog_heap.retainers = false              # retainer paths in every profile written
  #   config.datadog_heap.start_after_fork = false       # true: only forked workers record
  #   config.datadog_heap.endpoint = false               # true: DatadogHeap::Middleware at endpoint_path
  #   config.datadog_heap.endpoint_path = "/debug/heap"
  #   config.datadog_heap.endpoint_token = nil           # nil: loopback clients only
  #
  # Recording starts once the app is initialized, with the process-wide recorder (the one
  # DatadogHeap.recorder and the endpoint read). With output or upload it runs auto mode's
  # writer (see lib/datadog_heap/auto.rb) with these settings instead of the environment's (DD_*
  # tags still come from the environment). A puma or unicorn worker forked from a preloaded app
  # keeps recording with its own writer and files; with `start_after_fork`, the process that
  # boots the app does not record and every process forked from it starts on its own. An
  # invalid setting raises ArgumentError or TypeError at boot naming it and its value.
  class Railtie < ::Rails::Railtie
    DEFAULTS = {
      enabled: false, sample_every: nil, sampler: nil, preset: nil,
      output: nil, interval: nil, upload: nil,
      retainers: false, start_after_fork: false,
      endpoint: false, endpoint_path: "/debug/heap", endpoint_token: nil,
    }.freeze
    # Settings with no default value: left unset, the Recorder decides (max_overhead: the budget
    # applies to the default interval only, see Recorder).
    UNSET_BY_DEFAULT = %i[max_overhead].freeze
    # The longest interval taken, in seconds (a year).
    MAX_INTERVAL = 365 * 24 * 3600

    config.datadog_heap = ActiveSupport::OrderedOptions.new.merge!(DEFAULTS)

    # After config/initializers, so settings made there count; before the middleware stack is built.
    # First in the stack, ahead of Rails' HostAuthorization and SSL redirects: without a token the
    # middleware checks the Host header and proxy headers itself (see Middleware), so it does not
    # rely on config.hosts, which production apps often leave open.
    initializer "datadog_heap.endpoint", after: :load_config_initializers do |app|
      settings = Railtie.settings(app.config.datadog_heap)
      if settings[:endpoint]
        require "datadog_heap/middleware"
        # ?workers=1 takes the files the workers wrote in the last few intervals (WorkersView).
        app.config.middleware.insert_before(0, DatadogHeap::Middleware,
          path: settings[:endpoint_path], token: settings[:endpoint_token], workers_dir: settings[:output],
          workers_max_age: settings[:interval] && DatadogHeap::WorkersView.max_age_for(settings[:interval]))
      end
    end

    config.after_initialize do |app|
      Railtie.start(Railtie.settings(app.config.datadog_heap))
    end

    class << self
      # The settings of `options` (config.datadog_heap), checked; raises naming a bad one.
      def settings(options)
        name = ->(key) { "config.datadog_heap.#{key}" }
        unknown = options.keys.map(&:to_sym) - DEFAULTS.keys - UNSET_BY_DEFAULT
        unless unknown.empty?
          raise ArgumentError, "unknown setting#{"s" if unknown.size > 1} #{unknown.map { |k| name[k] }.join(", ")}; " \
            "known: #{(DEFAULTS.keys + UNSET_BY_DEFAULT).join(", ")}"
        end
        s = DEFAULTS.merge(options.to_h.transform_keys(&:to_sym))
        %i[enabled retainers start_after_fork endpoint].each { |key| Validate.boolean!(name[key], s[key]) }
        Validate.integer!(name[:sample_every], s[:sample_every], 1, Recorder::U32_MAX) unless s[:sample_every].nil?
        Validate.one_of!(name[:sampler], s[:sampler], Recorder::SAMPLERS) unless s[:sampler].nil?
        Validate.positive_number!(name[:max_overhead], s[:max_overhead], 1) unless s[:max_overhead].nil?
        unless s[:preset].nil?
          raise TypeError, "#{name[:preset]} must be a Symbol, got #{Validate.describe(s[:preset])}" unless Symbol === s[:preset]
          Validate.one_of!(name[:preset], s[:preset], Recorder::PRESETS.keys)
        end
        s[:output] = Validate.path!(name[:output], s[:output]) unless s[:output].nil?
        Validate.positive_number!(name[:interval], s[:interval], MAX_INTERVAL) unless s[:interval].nil?
        s[:upload] = upload_target(name[:upload], s[:upload]) unless s[:upload].nil?
        if s[:endpoint]
          require "datadog_heap/middleware"
          s[:endpoint_path] = with_name(name[:endpoint_path]) { Middleware.check_path(s[:endpoint_path]) }
          s[:endpoint_token] = with_name(name[:endpoint_token]) { Middleware.check_token(s[:endpoint_token]) }
        end
        s
      end

      # Starts recording as `settings` say (now, or in each forked child with start_after_fork).
      # Warns instead of raising: a failure here never stops the app.
      def start(settings)
        return unless settings[:enabled]

        if settings[:start_after_fork]
          @after_fork = settings
          # Loaded once here rather than in each worker. In the child, auto mode's hook runs
          # before ours (ForkHooks::AUTO_MODE < RAILTIE): a worker's own children are then auto
          # mode's to handle (after_fork forgets the settings there). Not after Process.daemon.
          require "datadog_heap/auto_mode" if settings[:output] || settings[:upload]
          ForkHooks.register(:railtie, ForkHooks::RAILTIE, daemon: false) { Railtie.after_fork }
        else
          start_now(settings)
        end
      end

      # Called in a forked child: starts recording there when start_after_fork asked for it.
      def after_fork
        settings = @after_fork
        @after_fork = nil # this child's own children inherit its recorder (and writer) instead
        start_now(settings) if settings
      end

      # Whether this process records because of the Railtie (for tests and the curious).
      def started?
        @started == Process.pid
      end

      private

      def start_now(settings)
        if defined?(DatadogHeap::Auto) && DatadogHeap::Auto.active?
          warn "datadog_heap: auto mode (datadog_heap/auto) already profiles this process; config.datadog_heap is not used"
          return
        end
        if settings[:output] || settings[:upload]
          require "datadog_heap/auto_mode"
          @started = Process.pid if DatadogHeap::Auto.setup(auto_env(settings))
        else
          DatadogHeap.start(**settings.slice(:sample_every, :sampler, :preset).compact, **settings.slice(:max_overhead))
          @started = Process.pid
        end
      rescue StandardError, ScriptError, NoMemoryError, SystemStackError => e
        warn "datadog_heap: not recording in pid #{Process.pid}: #{e.class}: #{e.message}"
      end

      # Auto mode's environment for `settings`: these variables replace the process's own.
      def auto_env(settings)
        ENV.to_h.merge(
          Auto::ENV_OUTPUT => settings[:output] ? File.join(settings[:output], "") : "",
          Auto::ENV_INTERVAL => settings[:interval]&.to_s || "",
          Auto::ENV_SAMPLE_EVERY => settings[:sample_every]&.to_s || "",
          Auto::ENV_SAMPLER => settings[:sampler]&.to_s || "",
          Auto::ENV_MAX_OVERHEAD => max_overhead_env(settings),
          Auto::ENV_PRESET => settings[:preset]&.to_s || "",
          Auto::ENV_RETAINERS => settings[:retainers] ? "1" : "",
          Upload::ENV_UPLOAD => settings[:upload] || "",
        )
      end

      # DATADOG_HEAP_MAX_OVERHEAD for the setting: "" when unset (the Recorder decides), "none"
      # for nil.
      def max_overhead_env(settings)
        return "" unless settings.key?(:max_overhead)

        settings[:max_overhead].nil? ? "none" : settings[:max_overhead].to_s
      end

      def upload_target(name, value)
        raise TypeError, "#{name} must be a String, got #{Validate.describe(value)}" unless String === value

        require "datadog_heap/upload"
        _, url = Upload.target(value.strip, ENV)
        if url
          Exporter.check_url(name, url)
          return value
        end

        raise ArgumentError, "#{name} must be agent, an agent URL (http://, https://, unix://), pyroscope or " \
          "pyroscope:URL, got #{Validate.show(Redact.text(value))}"
      end

      # Runs the block, naming `name` in the message of the TypeError or ArgumentError it raises.
      def with_name(name)
        yield
      rescue TypeError, ArgumentError => e
        raise e.class, "#{name}: #{e.message}"
      end
    end
  end
end
