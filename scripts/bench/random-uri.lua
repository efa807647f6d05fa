-- wrk script for scripts/bench-disk.sh: every request asks for a URL picked uniformly at random
-- among a set of objects of one size, "/d<size>-<i>?size=<size>&cc=max-age%3D3600" (the URLs the
-- script warmed the caches with): i from BENCH_INDEX_FILE (one index a line: the objects every
-- proxy holds), or 1..BENCH_N without it.
--
-- BENCH_PREFIX goes before the path: "http://127.0.0.1:<origin port>" (an absolute URI) when
-- wrk talks to a forward proxy, "" (origin-form) when it talks to the origin directly.
-- BENCH_HOST is the Host header: the origin's authority either way. BENCH_SEED seeds the draws
-- (the script gives every target the same seed in a round: the same sequence of URLs).
-- To keep wrk cheap, init() formats the requests once (all of them, or a random sample of
-- BENCH_TABLE when there are more), and request() only picks one at random.
-- No response callback: it would slow wrk down.
local prefix = os.getenv("BENCH_PREFIX")
local host = os.getenv("BENCH_HOST")
local size = tonumber(os.getenv("BENCH_SIZE") or "")
local n = tonumber(os.getenv("BENCH_N") or "")
local index_file = os.getenv("BENCH_INDEX_FILE")
local table_max = tonumber(os.getenv("BENCH_TABLE") or "1048576")
local seed = tonumber(os.getenv("BENCH_SEED") or "1")
if not prefix or not host or not size or not (index_file or (n and n >= 1)) then
  error("random-uri.lua needs BENCH_PREFIX, BENCH_HOST, BENCH_SIZE and BENCH_INDEX_FILE or BENCH_N in the environment")
end

local requests = {}
local count = 0
local random = math.random

init = function(args)
  math.randomseed(seed)
  local headers = { Host = host }
  local suffix = "?size=" .. size .. "&cc=max-age%3D3600"
  local base = prefix .. "/d" .. size .. "-"
  local index = {}
  if index_file then
    for line in io.lines(index_file) do
      local i = tonumber(line)
      if i then index[#index + 1] = i end
    end
  else
    for i = 1, n do index[i] = i end
  end
  if #index == 0 then error("random-uri.lua: no objects to ask for") end
  if #index <= table_max then
    count = #index
    for j = 1, count do
      requests[j] = wrk.format("GET", base .. index[j] .. suffix, headers)
    end
  else
    count = table_max
    for j = 1, count do
      requests[j] = wrk.format("GET", base .. index[random(#index)] .. suffix, headers)
    end
  end
end

request = function()
  return requests[random(count)]
end
