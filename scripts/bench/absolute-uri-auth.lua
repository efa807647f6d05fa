-- wrk script for scripts/bench-access.sh: every request asks a forward proxy for one URL,
-- optionally with proxy credentials.
--
-- BENCH_PATH is the request target, an absolute URI ("http://www.news.example.org:18180/…");
-- BENCH_HOST is the Host header (the origin's authority; wrk would otherwise send the proxy's
-- address). BENCH_PROXY_AUTH, when set and not empty, is sent as `Proxy-Authorization`
-- ("Basic YWxpY2U6c2VjcmV0"): the same header on every request, so after the first one the
-- proxy finds the credentials in its cache. No request/response callbacks: they would slow wrk
-- down (the headers are set once, as in scripts/bench/absolute-uri.lua).
local path = os.getenv("BENCH_PATH")
local host = os.getenv("BENCH_HOST")
local auth = os.getenv("BENCH_PROXY_AUTH")
if not path or not host then
  error("absolute-uri-auth.lua needs BENCH_PATH and BENCH_HOST in the environment")
end
wrk.method = "GET"
wrk.path = path
wrk.headers["Host"] = host
if auth and auth ~= "" then
  wrk.headers["Proxy-Authorization"] = auth
end
