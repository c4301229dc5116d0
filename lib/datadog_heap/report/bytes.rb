# frozen_string_literal: true

module DatadogHeap
  module Report
    # Byte counts as people read them ("1.5 MiB"), for the text reports and the HTML pages.
    module Bytes
      UNITS = %w[B KiB MiB GiB TiB].freeze

      module_function

      def human_bytes(bytes)
        return "-" if bytes.nil?

        value = bytes.abs.to_f
        unit = 0
        while value >= 1024 && unit < UNITS.size - 1
          value /= 1024
          unit += 1
        end
        text = unit.zero? ? "#{value.round} B" : format("%.1f %s", value, UNITS[unit])
        bytes.negative? ? "-#{text}" : text
      end

      def signed_bytes(bytes)
        bytes.negative? ? human_bytes(bytes) : "+#{human_bytes(bytes)}"
      end
    end
  end
end
