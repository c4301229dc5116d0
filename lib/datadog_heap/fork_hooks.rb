# frozen_string_literal: true

module DatadogHeap
  # What runs in a forked child, in one place: one hook on Process (Process.fork, Kernel#fork and
  # IO.popen with "-" go through Process._fork on Ruby >= 3.1; Process.daemon is hooked on its
  # own, since on Linux it calls libc daemon(3), not _fork) and an ordered list of the code that
  # brings the gem's parts into the child. Each part registers itself when it loads:
  #
  #   ForkHooks.register(:auto_mode, ForkHooks::AUTO_MODE) { Auto.after_fork }
  #
  # In the child the hooks run by their order, lowest first, whatever order the files loaded in:
  # the recorders are reset before auto mode restarts its writer on the process-wide one, and auto
  # mode's writer is set up before the Railtie decides whether this child starts one of its own.
  # Nothing needs doing before a fork: no lock of ours is ever held by a thread that is not
  # running Ruby code. A recorder the hook misses catches up at its next use (it notices the pid
  # changed). An exception from a hook reaches the code that forked, and the hooks after it do not
  # run.
  module ForkHooks
    # The orders of the gem's own hooks.
    RECORDERS = 10 # every recorder drops what the parent tracked (the extension)
    RSS_WATCH = 20 # the RSS watches of the parent's recorders start again (RssWatch)
    AUTO_MODE = 30 # datadog_heap/auto's writer and uploader start again (Auto)
    RAILTIE = 40 # the Railtie starts recording with start_after_fork (Railtie)

    # A registered hook: its name, order, whether it runs after Process.daemon, and the block.
    Hook = Struct.new(:name, :order, :daemon, :block)

    @hooks = []

    class << self
      # Runs the block in each forked child, at `order` among the other hooks (lowest first; the
      # earlier registered first on a tie), and after Process.daemon unless `daemon: false`.
      # Registering a `name` again replaces its hook. Returns `name`.
      def register(name, order, daemon: true, &block)
        raise ArgumentError, "ForkHooks.register needs a block (name #{name.inspect})" unless block
        raise TypeError, "order must be an Integer, got #{order.inspect}" unless Integer === order

        hooks = @hooks.reject { |hook| hook.name == name } << Hook.new(name, order, daemon, block)
        @hooks = hooks.each_with_index.sort_by { |hook, i| [hook.order, i] }.map(&:first).freeze
        name
      end

      # The names of the registered hooks, in the order they run.
      def names
        @hooks.map(&:name)
      end

      # Runs the hooks in the child: `event` is :fork (Process._fork) or :daemon (Process.daemon).
      def run(event)
        @hooks.each { |hook| hook.block.call if event == :fork || hook.daemon }
        nil
      end
    end

    # Prepended to Process's singleton class, once.
    module ProcessHook
      def _fork
        pid = super
        ForkHooks.run(:fork) if pid == 0
        pid
      end

      def daemon(*args)
        result = super
        ForkHooks.run(:daemon)
        result
      end
    end
  end
end

Process.singleton_class.prepend(DatadogHeap::ForkHooks::ProcessHook)
