# frozen_string_literal: true

# Loaded through RUBYOPT by bench/service.rb's "empty NEWOBJ hook" variant: installs a NEWOBJ
# hook that does nothing (no recorder), the floor any allocation sampler built on that hook pays.
# Forked workers inherit it.
require "datadog_heap"
DatadogHeap::Testing._native_empty_hook(true)
