# frozen_string_literal: true

# The CPU time this process's threads have run so far, from /proc/self/task/*/schedstat (Linux:
# the scheduler's own count, in nanoseconds); nothing where /proc has none. Used by
# bench/window_cost.rb and, inside the example service's workers, by bench/service/toggle.rb,
# which loads nothing else of the benches.
module ThreadCpu
  module_function

  # Nanoseconds by thread name (threads of one name summed).
  def run_ns_by_name
    Dir["/proc/self/task/*"].each_with_object(Hash.new(0)) do |task, h|
      h[File.read("#{task}/comm").strip] += File.read("#{task}/schedstat").split.first.to_i
    rescue SystemCallError
      next # the thread ended meanwhile
    end
  end

  # Nanoseconds of the gem's own threads: the native window timer, and the Ruby one beside it
  # before Ruby 3.3 (both named "datadog_heap ...").
  def gem_threads_ns(by_name = run_ns_by_name)
    by_name.sum { |name, ns| name.start_with?("datadog_heap") ? ns : 0 }
  end
end
