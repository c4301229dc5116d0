# frozen_string_literal: true

require "spec_helper"
require "tmpdir"
require_relative "../bench/lib/real_programs"

# Live objects per allocation site on real programs nobody here wrote, against exact truth:
# a jekyll build and a rubocop run (Debian packages), each in-process in a forked child
# under ObjectSpace.trace_object_allocations and a recorder at exactly sample_every 64 or 1024
# (max_overhead: nil: the overhead budget would raise the interval). Sites are file:line on both
# sides, by the same rule (see bench/lib/real_programs.rb). For the 10 sites that truly hold the
# most live objects:
# - each estimate must be inside its sampling error: neither tail probability of the estimate,
#   under the sampling model (n live objects give Poisson(n/m) samples, each weighing m; sigma =
#   sqrt((m - 1) n)), may be below 1e-5, about 4.3 sigma where a normal approximation holds. A
#   site with n/m = 2 expected samples may be off by +-100%; with 500, by +-20%. So does the sum
#   of the 10, and the program's total;
# - our top 10 must hold at least as many of them as the worst of 2000 profiles simulated from
#   the truth under the same model (a 1-in-2000 event if nothing is wrong).
# Ignoring the weights (an estimate of n/m), or putting a C method's allocations at its own frame
# instead of its caller's line, fails these by far. One program run per program and sample_every,
# shared by the examples; about 50 s in all here. :heavy: skipped under GC_STRESS.
# One program run per program and sample_every, shared by the examples that look at it.
module RealProgramsSpec
  ALPHA = 1e-5
  PROGRAMS = RealPrograms.programs(posts: 300, rubocop_dirs: %w[net uri csv])
  RUNS = {}
  DIRS = {}

  module_function

  # [what RealPrograms.measure returned, RealPrograms.compare of it]
  def compared(name, sample_every)
    RUNS[[name, sample_every]] ||= begin
      dir = (DIRS[name] ||= Dir.mktmpdir("datadog_heap_real").tap { |d| PROGRAMS[name][:setup].call(d) })
      result = RealPrograms.in_child { RealPrograms.measure(PROGRAMS[name], sample_every, dir) }
      [result, RealPrograms.compare(result)]
    end
  end

  def cleanup
    DIRS.each_value { |d| FileUtils.rm_rf(d) }
    DIRS.clear
    RUNS.clear
  end
end

RSpec.describe "live objects per site on real programs, against trace_object_allocations", :heavy do
  after(:all) { RealProgramsSpec.cleanup }

  def describe_site(s)
    format("%s: %d live, estimated %d (%+.0f%%, z %+.1f, %.1f expected samples, tails %.1e / %.1e)",
      RealPrograms.short(s[:location]), s[:truth], s[:estimate], 100 * s[:error], s[:z], s[:expected_samples],
      s[:p_low], s[:p_high])
  end

  %w[jekyll rubocop].each do |name|
    [64, 1024].each do |sample_every|
      context "#{name}, sample_every #{sample_every}" do
        let(:run) do
          skip "#{name} is not installed (apt-get install #{name})" unless RealPrograms.installed?(name)
          RealProgramsSpec.compared(name, sample_every)
        end
        let(:result) { run[0] }
        let(:comparison) { run[1] }

        it "samples at exactly the interval asked for, and loses no sample" do
          stats = result[:stats]
          expect(stats[:sampler_effective_sample_every]).to eq(sample_every)
          expect(stats[:lifetime_thinnings]).to eq(0) # else the weights would vary more than the model says
          lost = stats.slice(:lifetime_recordings_skipped_max_tracked, :lifetime_deferred_recordings_skipped_buffer_full,
            :lifetime_recordings_skipped_locked, :lifetime_recordings_failed, :sampler_skipped_by_recorder)
          expect(lost.values).to all(eq(0)), lost.inspect
          # Enough truth to say something: the 10th site expects at least a sample or two.
          expect(comparison[:sites].last[:expected_samples]).to be >= 1.5
        end

        it "estimates each of the 10 sites with the most live objects within its sampling error" do
          report = comparison[:sites].map { |s| describe_site(s) }.join("\n")
          comparison[:sites].each do |s|
            expect([s[:p_low], s[:p_high]].min).to be >= RealProgramsSpec::ALPHA, "#{describe_site(s)}\nall ten:\n#{report}"
          end
          comparison[:totals_tails].each do |what, (low, high)|
            est, truth = comparison[:totals][what]
            expect([low, high].min).to be >= RealProgramsSpec::ALPHA,
              "#{what}: estimated #{est}, true #{truth} (tails #{low} / #{high})\n#{report}"
          end
        end

        it "finds as many of the true top 10 in its own top 10 as the sampling error allows" do
          expect(comparison[:found]).to be >= comparison[:overlap_min],
            "found #{comparison[:found]} of 10; simulated from the truth: median #{comparison[:overlap_median]}, " \
            "worst #{comparison[:overlap_min]} of #{comparison[:overlaps].size}\n" +
            comparison[:sites].map { |s| describe_site(s) }.join("\n")
        end
      end
    end
  end
end
