-- wrk script for bench/sidecar_wrk.py: paced requests and a machine-readable summary.
--
-- wrk has no constant-rate mode (that is wrk2). Each connection waits `delay_ms` after each
-- response before sending the next request, so C connections give about C * 1000 / delay_ms
-- requests/s (a little less: the latency adds to each cycle). Latency is measured per request
-- and does not include the wait.
--
-- usage: wrk -t1 -c5 -d10s -s sidecar_wrk.lua URL -- DELAY_MS

local delay_ms = 10

function init(args)
  if args[1] ~= nil then
    delay_ms = tonumber(args[1])
  end
end

function delay()
  return delay_ms
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "WRKJSON {\"requests\":%d,\"duration_us\":%d,\"bytes\":%d,\"errors_connect\":%d," ..
    "\"errors_read\":%d,\"errors_write\":%d,\"errors_status\":%d,\"errors_timeout\":%d," ..
    "\"mean_us\":%.1f,\"p50_us\":%d,\"p90_us\":%d,\"p99_us\":%d,\"p999_us\":%d,\"max_us\":%d}\n",
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status,
    e.timeout, latency.mean, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency:percentile(99.9), latency.max))
end
