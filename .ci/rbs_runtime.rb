# frozen_string_literal: true

# RBS's runtime type checks (rbs/test/setup, from the rbs gem that ships with Ruby) on the gem's
# classes, for a spec run: every call of a method that sig/datadog_heap.rbs signs, on a class
# under DatadogHeap, has its arguments, block and return value checked against the signature,
# and a mismatch raises RBS::Test::Tester::TypeError, which fails the example. `rake spec:rbs`
# loads this before rspec:
#
#   ruby -r ./.ci/rbs_runtime.rb -S rspec spec/recorder_spec.rb ...
#
# One exception to RBS's own rules: a call that raised ArgumentError or TypeError is not checked.
# Those are the gem rejecting a bad argument, which is what the specs of bad input do on
# purpose; the signatures describe the calls the gem accepts. Past the first RBS_RUNTIME_FULL
# calls of one method (500), one in RBS_RUNTIME_EVERY (1000) is checked. At exit it prints how
# many calls of how many signed methods were checked, so a run that checked nothing shows.

sig = File.expand_path("../sig", __dir__)
ENV["RBS_TEST_TARGET"] ||= "DatadogHeap::*"
ENV["RBS_TEST_OPT"] ||= "-I #{sig}"
ENV["RBS_TEST_LOGLEVEL"] ||= "error"
ENV["RBS_TEST_DOUBLE_SUITE"] ||= "rspec"
require "rbs/test/setup"

module RbsRuntimeCheck
  CHECKED = Hash.new(0)
  REJECTED = Hash.new(0)
  SAMPLED_OUT = Hash.new(0)
  # Calls of one method checked in full; past it, one call in EVERY. A spec that reads 200,000
  # LiveObjects would otherwise spend minutes on checks that say nothing new.
  FULL = Integer(ENV.fetch("RBS_RUNTIME_FULL", "500"))
  EVERY = Integer(ENV.fetch("RBS_RUNTIME_EVERY", "1000"))

  # Counts each checked call; skips the calls the gem rejected with ArgumentError or TypeError.
  module SkipRejected
    def call(receiver, trace)
      name = "#{definition.type_name.to_s.delete_prefix("::")}#{format_method_name(trace.method_name)}"
      call = trace.method_call
      if call.exception? && [ArgumentError, TypeError].any? { |e| e === call.exit_value }
        REJECTED[name] += 1
        return
      end
      seen = CHECKED[name] + SAMPLED_OUT[name]
      if seen >= FULL && (seen % EVERY) != 0
        SAMPLED_OUT[name] += 1
        return
      end
      CHECKED[name] += 1
      # The block's calls likewise: each_live_object yields once per tracked object.
      trace.block_calls.slice!(FULL..) if trace.block_calls.size > FULL
      super
    end
  end
end
RBS::Test::Tester::MethodCallTester.prepend(RbsRuntimeCheck::SkipRejected)

module RbsRuntimeCheck
  # RBS hooks a method with alias_method in its class. Where a module of the gem prepended to
  # the class overrides the method (Recorder's RetainerSearch and RssLimit), alias_method finds
  # the module's method, and the hook, calling it, would come back to itself through `super`
  # forever. So the hook goes on the module's method instead: the same checks, against the
  # class's signature, at the method callers reach.
  module HookPrepended
    def hook_instance_method(klass, method, key:)
      owner = klass.instance_method(method).owner
      ancestors = klass.ancestors
      klass = owner if owner != klass && ancestors.index(owner) < ancestors.index(klass)
      super(klass, method, key: key)
    end
  end
end
RBS::Test::Hook.singleton_class.prepend(RbsRuntimeCheck::HookPrepended)

at_exit do
  checked = RbsRuntimeCheck::CHECKED
  warn format("RBS runtime check: %d calls of %d signed methods checked against sig/ (%d more past the first %d " \
    "of a method not checked, nor %d calls rejected with ArgumentError or TypeError)", checked.values.sum, checked.size,
    RbsRuntimeCheck::SAMPLED_OUT.values.sum, RbsRuntimeCheck::FULL, RbsRuntimeCheck::REJECTED.values.sum)
  warn "  checked: #{checked.keys.sort.join(", ")}" if ENV["RBS_RUNTIME_VERBOSE"] == "1"
end
