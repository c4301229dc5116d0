# frozen_string_literal: true

require "open3"
require "rbconfig"
require "tmpdir"

RSpec.describe "require \"datadog_heap/auto\"" do
  let(:lib) { File.expand_path("../lib", __dir__) }
  let(:script) { File.expand_path("fixtures/leaky_script.rb", __dir__) }

  let(:dir) { Dir.mktmpdir("datadog-heap-auto") }

  after { FileUtils.remove_entry(dir) }

  # Runs the leaky script (or `args`) under datadog_heap/auto with `env`; returns [stdout, stderr
  # lines other than the Ruby-version warning, exit code]. Every DATADOG_HEAP_* variable not in
  # `env` is unset.
  def auto_run(env, *args, chdir: dir)
    base = {"DATADOG_HEAP_OUTPUT" => nil, "DATADOG_HEAP_INTERVAL" => nil, "DATADOG_HEAP_SAMPLE_EVERY" => nil, "DATADOG_HEAP_MAX_OVERHEAD" => nil,
            "DATADOG_HEAP_SAMPLER" => nil}
    args = [script] if args.empty?
    out, err, status = Open3.capture3(base.merge(env), RbConfig.ruby, "-I", lib, "-rdatadog_heap/auto", *args, chdir: chdir)
    [out, RecorderHelpers.without_incidental(err), status.exitstatus]
  end

  def profiles(path = dir)
    Dir.children(path).grep(/\.pb\.gz\z/).sort_by { |f| f.scan(/\d+/).map(&:to_i) }
  end

  def leak_sites(path)
    DatadogHeap::Profile.load(path).top(5).select { |s| s.location.start_with?("#{script}:") }
  end

  it "writes periodic profiles from a background thread and a final one at exit, quietly" do
    out, err, code = auto_run({"DATADOG_HEAP_OUTPUT" => dir, "DATADOG_HEAP_INTERVAL" => "0.2",
      "DATADOG_HEAP_SAMPLE_EVERY" => "64", "LEAK_SECONDS" => "1.0", "DATADOG_HEAP_MAX_OVERHEAD" => "none"})
    expect([err, code]).to eq(["", 0])
    pid = out[/^pid (\d+)/, 1]
    files = profiles
    expect(files).to eq((1..files.size).map { |n| "heap-#{pid}-#{n}.pb.gz" })
    expect(files.size).to be >= 3 # a 1 s program, every 0.2 s (the writer gets the GVL when it can), plus the final one
    loaded = files.map { |f| DatadogHeap::Profile.load(File.join(dir, f)) }
    expect(loaded.map(&:period)).to all(eq(64))
    final = loaded.last
    expect(leak_sites(final.path)).not_to be_empty
    expect(final.top(1).first.location).to start_with("#{script}:")
    # The leak only grows, and the final profile (after a GC) sees the most of it.
    expect(final.total_bytes).to be >= loaded.first.total_bytes
  end

  it "writes only at exit, to a file, when DATADOG_HEAP_OUTPUT names one and no interval is set" do
    path = File.join(dir, "out", "heap.pb.gz")
    out, err, code = auto_run({"DATADOG_HEAP_OUTPUT" => path, "DATADOG_HEAP_MAX_OVERHEAD" => "none"})
    expect([err, code]).to eq(["", 0])
    expect(out).to match(/^pid \d+ kept/)
    expect(Dir.children(File.dirname(path))).to eq(["heap.pb.gz"])
    profile = DatadogHeap::Profile.load(path)
    expect(profile.period).to eq(DatadogHeap::Recorder::SAMPLE_EVERY.fetch(:windowed))
    expect(leak_sites(path)).not_to be_empty
  end

  it "writes heap-<pid>-1.pb.gz in the current directory by default" do
    out, err, code = auto_run({})
    expect([err, code]).to eq(["", 0])
    expect(profiles).to eq(["heap-#{out[/^pid (\d+)/, 1]}-1.pb.gz"])
  end

  it "gives a forked child its own writer thread and files" do
    out, err, code = auto_run({"DATADOG_HEAP_OUTPUT" => "#{dir}/", "DATADOG_HEAP_INTERVAL" => "0.1",
      "FORK_CHILD" => "1", "LEAK_SECONDS" => "0.5"})
    expect([err, code]).to eq(["", 0])
    parent = out[/^pid (\d+)/, 1]
    child = out[/^child (\d+)/, 1]
    expect(child).not_to be_nil
    child_files = profiles.grep(/\Aheap-#{child}-/)
    expect(child_files.size).to be >= 2 # periodic (the writer restarted after fork) and final
    expect(child_files).to eq((1..child_files.size).map { |n| "heap-#{child}-#{n}.pb.gz" })
    expect(profiles.grep(/\Aheap-#{parent}-/)).not_to be_empty
    expect(leak_sites(File.join(dir, child_files.last))).not_to be_empty
  end

  # Process.daemon forks through libc daemon(3), not Process._fork: the hook on daemon restarts
  # the writer there. Without it the daemon writes only its final profile.
  it "gives a Process.daemon its own writer thread and files" do
    pid_file = File.join(dir, "daemon.pid")
    program = <<~RUBY
      Process.daemon(true, true)
      File.write(#{pid_file.inspect} + ".tmp", Process.pid.to_s)
      File.rename(#{pid_file.inspect} + ".tmp", #{pid_file.inspect})
      keep = []
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 0.8
      while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
        keep << "leak" * 10
        sleep 0.01
      end
    RUBY
    _, err, code = auto_run({"DATADOG_HEAP_OUTPUT" => "#{dir}/", "DATADOG_HEAP_INTERVAL" => "0.1"}, "-e", program)
    expect([err, code]).to eq(["", 0])
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 20
    sleep 0.05 until File.exist?(pid_file) || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
    daemon = File.read(pid_file).to_i
    # Not our child: gone once /proc has no such process, or only its zombie is left.
    gone = -> { !File.exist?("/proc/#{daemon}/stat") || File.read("/proc/#{daemon}/stat")[/\) (\w)/, 1] == "Z" }
    sleep 0.05 until gone.call || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
    expect(gone.call).to be(true)
    files = profiles.grep(/\Aheap-#{daemon}-/)
    expect(files.size).to be >= 2 # periodic (the writer restarted in the daemon) and final
    expect(files).to eq((1..files.size).map { |n| "heap-#{daemon}-#{n}.pb.gz" })
  end

  it "keeps the program's exit status" do
    _, err, code = auto_run({"DATADOG_HEAP_OUTPUT" => dir, "EXIT_CODE" => "7"})
    expect([err, code]).to eq(["", 7])
    expect(profiles.size).to eq(1)
  end

  it "warns once about each invalid variable, naming it and its value, and falls back to the default" do
    _, err, code = auto_run({"DATADOG_HEAP_OUTPUT" => dir, "DATADOG_HEAP_INTERVAL" => "soon",
      "DATADOG_HEAP_SAMPLE_EVERY" => "0", "DATADOG_HEAP_SAMPLER" => "often", "DATADOG_HEAP_MAX_OVERHEAD" => "lots"})
    expect(code).to eq(0)
    expect(err.lines).to contain_exactly(
      "datadog_heap/auto: ignoring DATADOG_HEAP_INTERVAL=\"soon\": expected a number of seconds > 0; writing a profile at exit only\n",
      "datadog_heap/auto: ignoring DATADOG_HEAP_SAMPLE_EVERY=\"0\": expected an Integer between 1 and 4294967295; using the sampler's default\n",
      "datadog_heap/auto: ignoring DATADOG_HEAP_SAMPLER=\"often\": expected countdown or windowed; using the default (windowed, countdown for a sample_every below 1024)\n",
      "datadog_heap/auto: ignoring DATADOG_HEAP_MAX_OVERHEAD=\"lots\": expected a share of the CPU time above 0 and at most 1, or none; using the default (0.01 with the default sample_every, none when DATADOG_HEAP_SAMPLE_EVERY is set)\n"
    )
    expect(profiles.size).to eq(1) # no interval: the final profile only
    # The default sample_every, or above it where the default overhead budget raised it.
    expect(DatadogHeap::Profile.load(File.join(dir, profiles.first)).period).to be >= 1024

    {"DATADOG_HEAP_INTERVAL" => ["-1", "0", "NaN", "Infinity"], "DATADOG_HEAP_SAMPLE_EVERY" => ["1.5", "lots", "99999999999"]}
      .each do |name, values|
        values.each do |value|
          out, err = Dir.mktmpdir do |sub|
            auto_run({"DATADOG_HEAP_OUTPUT" => sub, name => value}, "-e", "puts Dir.children(ENV['DATADOG_HEAP_OUTPUT']).size")
          end
          expect(err).to start_with("datadog_heap/auto: ignoring #{name}=#{value.inspect}: "), "#{name}=#{value}: #{err}"
          expect(err.lines.size).to eq(1)
          expect(out).to eq("0\n")
        end
      end
  end

  it "never takes the program down when profiles cannot be written: it warns once" do
    blocker = File.join(dir, "a-file")
    File.write(blocker, "")
    out, err, code = auto_run({"DATADOG_HEAP_OUTPUT" => "#{blocker}/profiles/", "DATADOG_HEAP_INTERVAL" => "0.1",
      "LEAK_SECONDS" => "0.5"})
    expect(code).to eq(0)
    expect(out).to match(/^pid \d+ kept/)
    expect(err.lines.size).to eq(1)
    expect(err).to match(%r{\Adatadog_heap/auto: could not write #{Regexp.escape(blocker)}/profiles/heap-\d+-1\.pb\.gz: Errno::})
  end
end
