# frozen_string_literal: true

# HEAP_AUTO_IN_APP=1: the app itself requires the profiler (as a Gemfile's `Bundler.require`
# would), instead of RUBYOPT loading it into every process.
if ENV["HEAP_AUTO_IN_APP"] == "1"
  require "datadog_heap/auto"
  # Which timer opens this worker's windows ("native" or "ruby"; nil without a windowed recorder).
  warn "datadog_heap window timer in #{Process.pid}: #{DatadogHeap.recorder&.stats&.fetch(:window_timer, nil).inspect}"
end
require_relative "app"
run ServiceApp
