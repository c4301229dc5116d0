# frozen_string_literal: true

module DatadogHeap
  VERSION = "0.1.0"
end
