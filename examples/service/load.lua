-- wrk script for the example service: keep-alive connections sending a mix of its endpoints,
-- one in four a /report with a query never seen before (the leaking one).
--
--   wrk -t2 -c8 -d10s -s examples/service/load.lua http://127.0.0.1:9292 -- 10000
--
-- The argument after -- is the most responses each wrk thread waits for (-t2 -- 10000: at most
-- about 20000 requests); without it only wrk's -d bounds the run. A thread that got them prints
-- `WRK_THREAD_DONE` and stops; wrk itself runs on to -d, unless sent SIGINT (cluster.rb's `wrk`
-- does that once every thread is done, so its rates use the real duration). done() prints one line,
-- `WRK_JSON {...}`: requests, duration (µs), errors by kind, latency percentiles (µs).

local threads = {}

function setup(thread)
  thread:set("thread_id", #threads)
  table.insert(threads, thread)
end

local counter = 0
local responses = 0
local limit = nil

function init(args)
  limit = tonumber(args[1])
  math.randomseed(1000 + thread_id)
end

-- LOAD_APP=rails: the Rails app of examples/rails_leak (an order as HTML and as JSON, a search).
local rails = os.getenv("LOAD_APP") == "rails"

function request()
  counter = counter + 1
  local kind = counter % 4
  local path
  if rails then
    if kind == 0 then
      path = "/orders/" .. (counter % 500)
    elseif kind == 1 then
      path = "/orders/" .. (counter % 500) .. ".json"
    elseif kind == 2 then
      path = "/search?q=widget+" .. (counter % 13) .. "+blue"
    else
      path = "/orders/" .. math.floor(1000 * math.random() ^ 2) .. "?ref=" .. thread_id .. "-" .. counter
    end
  elseif kind == 0 then
    path = "/orders.json?page=" .. (counter % 7)
  elseif kind == 1 then
    path = "/dashboard"
  elseif kind == 2 then
    -- Skewed towards low ids, as real traffic is: the LRU gets hits and evictions.
    path = "/price/" .. math.floor(1024 * math.random() ^ 3)
  else
    path = "/report?account=" .. (counter % 50) .. "&request=" .. thread_id .. "-" .. counter
  end
  return wrk.format("GET", path)
end

function response(status, headers, body)
  responses = responses + 1
  if responses == limit then
    -- wrk idles until -d once every thread stopped: the line tells whoever runs it to end the run
    -- with SIGINT (wrk then reports the time it really took).
    io.write("WRK_THREAD_DONE\n")
    io.flush()
    wrk.thread:stop()
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRK_JSON {"requests":%d,"duration_us":%d,"bytes":%d,"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
    '"latency_us":{"p50":%d,"p90":%d,"p99":%d,"max":%d,"mean":%.1f}}\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max, latency.mean))
end
