# frozen_string_literal: true

# Loaded through RUBYOPT by bench/service/stage_run.rb: each forked puma worker starts a Recorder
# at its defaults with the stage counters on, and every 2 s writes its process CPU time, the
# recorder's stats, the stage counters and the GC's counts since it started to
# STAGE_OUT/<pid>.json.
require "datadog_heap"
require "json"

module ServiceStages
  OUT = ENV.fetch("STAGE_OUT")
  STATS = %i[sampler_samples_recorded sampler_allocations_seen sampler_overhead_ns_total sampler_overhead_cpu_ns
    sampler_effective_sample_every num_object_records lifetime_stack_cache_hits lifetime_stack_cache_misses
    sampler_windows_opened sampler_window_ticks sampler_window_allocations sampler_window_armed_allocations
    sampler_window_late_allocations sampler_windows_spanned].freeze

  def self.run
    DatadogHeap::Testing._native_set_stage_costs(true)
    # The countdown by default (the breakdown in README is the countdown's, the default then);
    # STAGE_SAMPLER=windowed for the windowed sampler.
    # STAGE_SAMPLE_EVERY=N for a fixed interval (no budget), so runs compare sample for sample.
    options = {sampler: ENV.fetch("STAGE_SAMPLER", "countdown").to_sym}
    options[:sample_every] = Integer(ENV["STAGE_SAMPLE_EVERY"]) if ENV["STAGE_SAMPLE_EVERY"]
    rec = DatadogHeap::Recorder.new(**options)
    rec.start
    cpu0 = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)
    gc0 = GC.stat.slice(:count, :total_allocated_objects)
    loop do
      sleep 2
      out = {cpu: Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID) - cpu0, stats: rec.stats.slice(*STATS),
             stages: DatadogHeap::Testing._native_stage_costs, gcs: GC.stat(:count) - gc0[:count],
             allocations: GC.stat(:total_allocated_objects) - gc0[:total_allocated_objects]}
      File.write(File.join(OUT, "#{Process.pid}.json"), JSON.generate(out))
    end
  end

  # Starts the thread in each forked worker.
  module AfterFork
    def _fork
      pid = super
      Thread.new { ServiceStages.run } if pid.zero?
      pid
    end
  end
end

Process.singleton_class.prepend(ServiceStages::AfterFork)
