# frozen_string_literal: true

# Debian ships rspec-core 3.12; dd-trace-rb's spec_helper sets `pending_failure_output`, which
# 3.13 added (how much of a pending example's failure to print). Loaded with `rspec -r` before
# spec_helper, this adds the setting where it is missing; 3.12 then prints pending examples as
# it always does. It changes no example's outcome.
require "rspec/core"

unless RSpec::Core::Configuration.method_defined?(:pending_failure_output=)
  RSpec.configure { |config| config.add_setting :pending_failure_output, default: :full }
end
