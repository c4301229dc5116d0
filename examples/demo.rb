# frozen_string_literal: true

# The demo: for now it shows that the gem and its native extension load and agree on a version.
# Run it with `bin/demo` (or `rake demo`).
require "datadog_heap"

puts "datadog_heap #{DatadogHeap::VERSION} (native #{DatadogHeap._native_version}) on ruby #{RUBY_VERSION}"
