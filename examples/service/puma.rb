# frozen_string_literal: true

# Puma configuration of the example service (or, with SERVICE_APP=rails, the Rails app): cluster mode, WORKERS (default 2) forked from a
# master that loaded the app first (preload_app!), THREADS (default 4) threads each, listening on
# 127.0.0.1:PORT (default 9292) only.
#
#   puma -C examples/service/puma.rb
#
# With preload_app!, puma has no phased restart: SIGUSR1 restarts the whole cluster (the master
# re-executes itself and forks new workers), as SIGUSR2 does.

workers Integer(ENV.fetch("WORKERS", "2"), 10)
threads_count = Integer(ENV.fetch("THREADS", "4"), 10)
threads threads_count, threads_count
# PRELOAD=0: each worker loads the app itself after the fork (puma's default), so a gem the app
# requires is first required in the forked child (spec/stress/service_no_preload_spec.rb).
preload_app! unless ENV["PRELOAD"] == "0"
bind "tcp://127.0.0.1:#{Integer(ENV.fetch("PORT", "9292"), 10)}"
environment ENV.fetch("RACK_ENV", "production")
# SERVICE_APP=rails serves the Rails app of examples/rails_leak instead (its leak off unless
# LEAKY_APP_LEAK=1), for the benches' Rails rows.
rackup(ENV["SERVICE_APP"] == "rails" ? File.expand_path("../rails_leak/config.ru", __dir__) : File.join(__dir__, "config.ru"))
# A worker still busy this long after SIGTERM is killed, and shows up as one without a final profile.
worker_shutdown_timeout 10
# After a graceful stop on SIGTERM, exit 0 instead of re-raising the signal (so `datadog-heap
# run -- puma ...` exits 0 too).
raise_exception_on_sigterm false
