# frozen_string_literal: true

$LOAD_PATH.unshift(File.expand_path("../lib", __dir__))
require "objspace"
require "datadog_heap"
require_relative "support_helpers"

RSpec.configure do |config|
  config.disable_monkey_patching!
  config.expect_with(:rspec) { |c| c.syntax = :expect }
  config.order = :random
  Kernel.srand(config.seed)
  # spec/stress/ (tagged :stress) runs with `rspec --tag stress` / `rake spec:stress` only.
  config.filter_run_excluding stress: true

  # GC_STRESS=1 runs every example under GC.stress (a full GC at every allocation), to shake out
  # objects the extension fails to mark or keeps across a GC by mistake. GC_STRESS=minor runs a
  # minor GC instead (GC.stress flag 0x01): it frees any unmarked young object, which is what a
  # just-sampled object is, at a fraction of the cost. Slow either way: meant for CI and for
  # chasing a crash (`rake spec:gc_stress` runs a process per file).
  stress = RecorderHelpers::GC_STRESS_SETTING
  if stress
    config.around do |example|
      GC.stress = stress
      example.run
    ensure
      GC.stress = false
    end
  end
end
