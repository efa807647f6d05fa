-- wrk script for scripts/bench-hits.sh: every request asks for one URL.
--
-- BENCH_PATH is the request target: an absolute URI ("http://127.0.0.1:18080/obj?size=1024")
-- when wrk talks to a forward proxy, or an origin-form path ("/obj?size=1024") when it talks
-- to the origin directly. BENCH_HOST is the Host header: the origin's authority either way
-- (wrk would otherwise send the proxy's address as Host). wrk connects to the address given
-- on its command line. No request/response callbacks: they would slow wrk down.
local path = os.getenv("BENCH_PATH")
local host = os.getenv("BENCH_HOST")
if not path or not host then
  error("absolute-uri.lua needs BENCH_PATH and BENCH_HOST in the environment")
end
wrk.method = "GET"
wrk.path = path
wrk.headers["Host"] = host
