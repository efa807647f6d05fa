-- wrk script for scripts/bench-icp.sh: every request asks for a URL never asked before, of
-- any node (the worst case for ICP: each request misses locally and at every sibling).
--
-- BENCH_PREFIX is the absolute URI prefix, unique per node, configuration and run
-- ("http://127.0.0.1:18090/r2-mcicp-n3/"); the request number and a query string follow:
-- "<prefix><n>?size=<bytes>&cc=max-age%3D600[&delay_ms=D]". Sizes cycle deterministically
-- through 2..10 KiB (the same sequence in every run, like the paper's fixed seeds).
-- BENCH_HOST is the Host header (the origin's authority); BENCH_DELAY_MS, when not 0, asks the
-- origin to wait that long before answering.
-- done() prints the run's figures for the script: requests, errors, and the latency histogram
-- (microseconds, "value:count" pairs) as measured, that is with wrk's own "correction" undone:
-- before done() is called, wrk 4.1 adds, for every sample of at least twice the mean interval
-- between requests on a connection (duration / (requests / connections)), synthetic samples
-- (sample - interval, sample - 2 intervals, ...), which would make the mean exceed what a
-- closed loop can have (Little's law). BENCH_CONNS is wrk's -c.
local prefix = os.getenv("BENCH_PREFIX")
local host = os.getenv("BENCH_HOST")
local delay = tonumber(os.getenv("BENCH_DELAY_MS") or "0") or 0
if not prefix or not host then
  error("unique-urls.lua needs BENCH_PREFIX and BENCH_HOST in the environment")
end
local suffix = "&cc=max-age%3D600"
if delay > 0 then suffix = suffix .. "&delay_ms=" .. delay end
local headers = { Host = host }
local n = 0

request = function()
  n = n + 1
  local size = (2 + (n * 7) % 9) * 1024
  return wrk.format("GET", prefix .. n .. "?size=" .. size .. suffix, headers)
end

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("BENCH requests %d\n", summary.requests))
  io.write(string.format("BENCH errors %d %d %d %d %d\n", e.connect, e.read, e.write, e.status, e.timeout))
  io.write(string.format("BENCH duration_us %d\n", summary.duration))
  -- The histogram as wrk holds it: distinct values ascending, with their counts.
  local vals, cnts = {}, {}
  for i = 1, #latency do
    local v, c = latency(i)
    vals[i] = v
    cnts[i] = c
  end
  -- Undo stats_correct(expected): for m > expected, corrected[m] = measured[m] + the sum of
  -- measured[m + k * expected] over k >= 1; solved from the top value down.
  local conns = tonumber(os.getenv("BENCH_CONNS") or "0") or 0
  local per = conns > 0 and math.floor(summary.requests / conns) or 0
  local expected = per > 0 and math.floor(summary.duration / per) or 0
  if expected > 0 then
    local above = {}
    for i = #vals, 1, -1 do
      local v = vals[i]
      if v > expected then
        local r = v % expected
        local c = cnts[i] - (above[r] or 0)
        cnts[i] = c
        above[r] = (above[r] or 0) + c
      end
    end
  end
  local out, n, sum = {}, 0, 0
  for i = 1, #vals do
    if cnts[i] > 0 then
      out[#out + 1] = vals[i] .. ":" .. cnts[i]
      n = n + cnts[i]
      sum = sum + vals[i] * cnts[i]
    end
  end
  io.write(string.format("BENCH measured %d %.3f %d\n", n, n > 0 and sum / n or 0, expected))
  io.write("BENCH histogram_us " .. table.concat(out, " ") .. "\n")
end
