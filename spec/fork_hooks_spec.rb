# frozen_string_literal: true

require_relative "spec_helper"
require "open3"
require "rbconfig"

# DatadogHeap::ForkHooks: one hook on Process, and what runs in a forked child in a fixed order
# whatever order the files loaded in. Each example runs in a Ruby of its own, so that its hooks
# and forks stay out of the suite's process.
RSpec.describe "DatadogHeap::ForkHooks" do
  # Runs `script` in a new Ruby with this lib/; its stdout.
  def ruby(script)
    out, err, status = Open3.capture3(RbConfig.ruby, "-I", File.expand_path("../lib", __dir__), "-e", script)
    expect(status).to be_success, "exit #{status.exitstatus}: #{err}"
    out
  end

  it "is the one fork hook the gem puts on Process, auto mode loaded or not" do
    out = ruby(<<~RUBY)
      require "datadog_heap/auto_mode"
      hooks = Process.singleton_class.ancestors.select { |m| m.name.to_s.start_with?("DatadogHeap::") }
      forks = hooks.select { |m| m.method_defined?(:_fork, false) || m.method_defined?(:daemon, false) }
      puts forks.map(&:name).join(",")
      puts DatadogHeap::ForkHooks.names.join(",")
    RUBY
    expect(out.lines.map(&:chomp)).to eq(["DatadogHeap::ForkHooks::ProcessHook", "recorders,rss_watch,auto_mode"])
  end

  it "runs the hooks in a forked child by their order, not the order they were registered in" do
    out = ruby(<<~RUBY)
      require "datadog_heap"
      ran = []
      DatadogHeap::ForkHooks.register(:last, 99) { ran << :last }
      DatadogHeap::ForkHooks.register(:first, 1) { ran << :first }
      DatadogHeap::ForkHooks.register(:between, DatadogHeap::ForkHooks::RECORDERS + 1) { ran << :between }
      DatadogHeap::ForkHooks.register(:after_auto_mode, DatadogHeap::ForkHooks::AUTO_MODE + 1, daemon: false) { ran << :after_auto_mode }
      reader, writer = IO.pipe
      pid = fork do
        reader.close
        writer.puts(ran.join(","))
        writer.close
        exit!(0)
      end
      writer.close
      puts reader.read
      Process.wait(pid)
      puts ran.empty?
      DatadogHeap::ForkHooks.run(:daemon)
      puts ran.join(",")
    RUBY
    expect(out.lines.map(&:chomp)).to eq([
      "first,between,after_auto_mode,last", # in the child; the recorders' own hooks ran among them
      "true", # nothing ran in the parent
      "first,between,last", # after Process.daemon, the hooks registered with daemon: false do not run
    ])
  end

  it "refuses a hook without a block or with an order that is not an Integer" do
    out = ruby(<<~RUBY)
      require "datadog_heap"
      begin
        DatadogHeap::ForkHooks.register(:x, 1)
      rescue ArgumentError => e
        puts e.message
      end
      begin
        DatadogHeap::ForkHooks.register(:x, "1") {}
      rescue TypeError => e
        puts e.message
      end
    RUBY
    expect(out.lines.map(&:chomp)).to eq(["ForkHooks.register needs a block (name :x)", 'order must be an Integer, got "1"'])
  end
end

# Recorder's surface is read from recorder.rb: no other file reopens the class, and the modules
# it prepends are named there. Its test aids are DatadogHeap::Testing's.
RSpec.describe DatadogHeap::Recorder do
  lib = File.expand_path("../lib", __dir__)

  it "is opened in recorder.rb only, which names the modules it prepends" do
    opened = Dir[File.join(lib, "**", "*.rb")].select { |f| File.read(f).match?(/^\s*class Recorder\b/) }
    expect(opened.map { |f| f.delete_prefix("#{lib}/") }).to eq(["datadog_heap/recorder.rb"])
    gem_modules = described_class.ancestors.take_while { |m| m != described_class }
    expect(gem_modules).to eq([DatadogHeap::RetainerSearch, DatadogHeap::RssLimit])
    source = File.read(File.join(lib, "datadog_heap", "recorder.rb"))
    gem_modules.each { |m| expect(source).to include("prepend #{m.name.delete_prefix("DatadogHeap::")}") }
  end

  it "keeps its test aids private: DatadogHeap::Testing reaches them" do
    rec = described_class.new(sampler: :countdown)
    expect { rec.exhaust_record_ids! }.to raise_error(NoMethodError, /private method/)
    expect { rec.reset_last_update! }.to raise_error(NoMethodError, /private method/)
    expect { DatadogHeap::Testing.reset_last_update!(rec) }.not_to raise_error
    expect(described_class.public_instance_methods).not_to include(:exhaust_record_ids!, :reset_last_update!)
  end
end
