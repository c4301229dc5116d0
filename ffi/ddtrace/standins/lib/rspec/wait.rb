# frozen_string_literal: true

# Stand-in for the `rspec-wait` gem (not on Debian): `wait_for { value }.to matcher` retries the
# block until the matcher passes or `config.wait_timeout` seconds (default 10) have gone by.
require "rspec/expectations"

module RSpec
  module Wait
    class Target
      def initialize(block) = @block = block

      def to(matcher = nil, &) = retry_until { RSpec::Expectations::ExpectationTarget.new(@block.call).to(matcher, &) }

      def not_to(matcher = nil, &) = retry_until { RSpec::Expectations::ExpectationTarget.new(@block.call).not_to(matcher, &) }
      alias_method :to_not, :not_to

      private

      def retry_until
        deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + (RSpec.configuration.wait_timeout || 10)
        begin
          yield
        rescue RSpec::Expectations::ExpectationNotMetError
          raise if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

          sleep 0.05
          retry
        end
      end
    end

    def wait_for(&block) = Target.new(block)
  end
end

RSpec.configure do |config|
  config.add_setting :wait_timeout, default: 10
  config.add_setting :wait_delay, default: 0.05
  config.include RSpec::Wait
end
