//! The caching rules, one scenario each, as a table: each step sends a request through a fresh
//! proxy to a real origin and checks the status, `X-Cache`, the access-log code and how many
//! times the origin was hit.

mod common;

use std::time::Duration;

use common::{node, request};
use meshcache_lab::Origin;

struct Step {
    method: &'static str,
    /// Origin path and query.
    path: &'static str,
    headers: &'static [(&'static str, &'static str)],
    /// Pause before sending.
    wait_ms: u64,
    status: u16,
    /// Expected X-Cache verdict.
    x_cache: &'static str,
    /// Expected Squid result code in the access log.
    log: &'static str,
    /// Origin requests for `path` after this step.
    origin_hits: u64,
    /// A header that must be present with this value (or prefix, when ending in '*'; or any of
    /// several, separated by '|').
    expect_header: Option<(&'static str, &'static str)>,
    /// Body length expected.
    body_len: Option<usize>,
    /// Extra origin requests that may or may not have happened yet (background refreshes).
    slack: u64,
}

const fn step(
    method: &'static str,
    path: &'static str,
    status: u16,
    x_cache: &'static str,
    log: &'static str,
    origin_hits: u64,
) -> Step {
    Step {
        method,
        path,
        headers: &[],
        wait_ms: 0,
        status,
        x_cache,
        log,
        origin_hits,
        expect_header: None,
        body_len: None,
        slack: 0,
    }
}

impl Step {
    const fn with(mut self, headers: &'static [(&'static str, &'static str)]) -> Self {
        self.headers = headers;
        self
    }
    const fn after(mut self, ms: u64) -> Self {
        self.wait_ms = ms;
        self
    }
    const fn expect(mut self, name: &'static str, value: &'static str) -> Self {
        self.expect_header = Some((name, value));
        self
    }
    const fn slack(mut self, n: u64) -> Self {
        self.slack = n;
        self
    }
    const fn len(mut self, n: usize) -> Self {
        self.body_len = Some(n);
        self
    }
}

const GET: &str = "GET";

#[rustfmt::skip]
fn scenarios() -> Vec<(&'static str, Vec<Step>)> {
    vec![
        ("max-age: fresh response is served from the store", vec![
            step(GET, "/a?size=100&cc=max-age=60", 200, "MISS", "TCP_MISS/200", 1).len(100),
            // Age counts whole seconds of the clock: a hit a millisecond after the store can cross
            // one (RFC 9111 §4.2.3 allows the overestimate), as a CI run once did.
            step(GET, "/a?size=100&cc=max-age=60", 200, "HIT", "TCP_MEM_HIT/200", 1).len(100).expect("age", "0|1"),
        ]),
        ("s-maxage overrides max-age for a shared cache", vec![
            step(GET, "/b?cc=max-age=60,s-maxage=0&etag=v1", 200, "MISS", "TCP_MISS/200", 1),
            step(GET, "/b?cc=max-age=60,s-maxage=0&etag=v1", 200, "HIT", "TCP_REFRESH_UNMODIFIED/200", 2),
        ]),
        ("Expires in the future is fresh", vec![
            step(GET, "/c?expires=60", 200, "MISS", "TCP_MISS/200", 1),
            step(GET, "/c?expires=60", 200, "HIT", "TCP_MEM_HIT/200", 1),
        ]),
        ("Expires in the past without validators is not kept", vec![
            step(GET, "/d?expires=-10", 200, "MISS", "TCP_MISS/200", 1),
            step(GET, "/d?expires=-10", 200, "MISS", "TCP_MISS/200", 2),
        ]),
        ("heuristic freshness from Last-Modified", vec![
            step(GET, "/e?lm=100000", 200, "MISS", "TCP_MISS/200", 1),
            step(GET, "/e?lm=100000", 200, "HIT", "TCP_MEM_HIT/200", 1),
        ]),
        ("Age from upstream counts against freshness", vec![
            step(GET, "/f?cc=max-age=60&hdr=Age:50", 200, "MISS", "TCP_MISS/200", 1),
            step(GET, "/f?cc=max-age=60&hdr=Age:50", 200, "HIT", "TCP_MEM_HIT/200", 1).expect("age", "5*"),
            step(GET, "/f?cc=max-age=60&hdr=Age:50", 200, "MISS", "TCP_REFRESH_MODIFIED/200", 2).with(&[("cache-control", "max-age=40")]).expect("x-origin-count", "2"),
        ]),
        ("no-store is never stored", vec![
            step(GET, "/g?cc=no-store,max-age=60", 200, "MISS", "TCP_MISS/200", 1),
            step(GET, "/g?cc=no-store,max-age=60", 200, "MISS", "TCP_MISS/200", 2),
        ]),
        ("private is not stored by a shared cache", vec![
            step(GET, "/h?cc=private,max-age=60", 200, "MISS", "TCP_MISS/200", 1),
            step(GET, "/h?cc=private,max-age=60", 200, "MISS", "TCP_MISS/200", 2),
        ]),
        ("no-cache response: stored, revalidated every time, 304 headers merged", vec![
            step(GET, "/i?cc=no-cache&etag=v1&size=10", 200, "MISS", "TCP_MISS/200", 1),
            step(GET, "/i?cc=no-cache&etag=v1&size=10", 200, "HIT", "TCP_REFRESH_UNMODIFIED/200", 2).len(10).expect("x-origin-count", "2"),
        ]),
        ("must-revalidate forbids serving stale even when the client allows it", vec![
            step(GET, "/j?cc=max-age=1,must-revalidate&etag=v1", 200, "MISS", "TCP_MISS/200", 1),
            step(GET, "/j?cc=max-age=1,must-revalidate&etag=v1", 200, "HIT", "TCP_REFRESH_UNMODIFIED/200", 2).after(2100).with(&[("cache-control", "max-stale=100")]),
        ]),
        ("Authorization: not stored unless public", vec![
            step(GET, "/k?cc=max-age=60", 200, "MISS", "TCP_MISS/200", 1).with(&[("authorization", "Basic dTpw")]),
            step(GET, "/k?cc=max-age=60", 200, "MISS", "TCP_MISS/200", 2).with(&[("authorization", "Basic dTpw")]),
            step(GET, "/k2?cc=max-age=60,public", 200, "MISS", "TCP_MISS/200", 1).with(&[("authorization", "Basic dTpw")]),
            step(GET, "/k2?cc=max-age=60,public", 200, "HIT", "TCP_MEM_HIT/200", 1).with(&[("authorization", "Basic dTpw")]),
        ]),
        ("Vary: one stored variant per Accept-Encoding", vec![
            step(GET, "/l?cc=max-age=60&vary=Accept-Encoding", 200, "MISS", "TCP_MISS/200", 1).with(&[("accept-encoding", "gzip")]),
            step(GET, "/l?cc=max-age=60&vary=Accept-Encoding", 200, "HIT", "TCP_MEM_HIT/200", 1).with(&[("accept-encoding", "gzip")]),
            step(GET, "/l?cc=max-age=60&vary=Accept-Encoding", 200, "MISS", "TCP_MISS/200", 2).with(&[("accept-encoding", "br")]),
            step(GET, "/l?cc=max-age=60&vary=Accept-Encoding", 200, "HIT", "TCP_MEM_HIT/200", 2).with(&[("accept-encoding", "br")]),
        ]),
        ("Vary: * is never reused", vec![
            step(GET, "/l2?cc=max-age=60&vary=*", 200, "MISS", "TCP_MISS/200", 1),
            step(GET, "/l2?cc=max-age=60&vary=*", 200, "MISS", "TCP_MISS/200", 2),
        ]),
        ("an unsafe method invalidates the URL", vec![
            step(GET, "/m?cc=max-age=60", 200, "MISS", "TCP_MISS/200", 1),
            step("POST", "/m?cc=max-age=60", 200, "MISS", "TCP_MISS/200", 2),
            step(GET, "/m?cc=max-age=60", 200, "MISS", "TCP_MISS/200", 3),
            step(GET, "/m?cc=max-age=60", 200, "HIT", "TCP_MEM_HIT/200", 3),
        ]),
        ("HEAD and Range are served from the full stored object", vec![
            step(GET, "/n?size=1000&cc=max-age=60", 200, "MISS", "TCP_MISS/200", 1).len(1000),
            step("HEAD", "/n?size=1000&cc=max-age=60", 200, "HIT", "TCP_MEM_HIT/200", 1).len(0).expect("content-length", "1000"),
            step(GET, "/n?size=1000&cc=max-age=60", 206, "HIT", "TCP_MEM_HIT/206", 1).with(&[("range", "bytes=10-19")]).len(10).expect("content-range", "bytes 10-19/1000"),
            step(GET, "/n?size=1000&cc=max-age=60", 416, "HIT", "TCP_MEM_HIT/416", 1).with(&[("range", "bytes=5000-")]),
        ]),
        ("a Range miss answered whole (200) is stored, and later ranges come from it", vec![
            step(GET, "/n2?size=1000&cc=max-age=60", 200, "MISS", "TCP_MISS/200", 1).with(&[("range", "bytes=0-9")]).len(1000),
            step(GET, "/n2?size=1000&cc=max-age=60", 206, "HIT", "TCP_MEM_HIT/206", 1).with(&[("range", "bytes=0-9")]).len(10),
            step(GET, "/n2?size=1000&cc=max-age=60", 200, "HIT", "TCP_MEM_HIT/200", 1),
        ]),
        ("request max-age=0 and no-cache force revalidation", vec![
            step(GET, "/o?cc=max-age=60&etag=v1", 200, "MISS", "TCP_MISS/200", 1),
            step(GET, "/o?cc=max-age=60&etag=v1", 200, "HIT", "TCP_REFRESH_UNMODIFIED/200", 2).with(&[("cache-control", "max-age=0")]),
            step(GET, "/o?cc=max-age=60&etag=v1", 200, "HIT", "TCP_REFRESH_UNMODIFIED/200", 3).with(&[("pragma", "no-cache")]),
            step(GET, "/o?cc=max-age=60&etag=v1", 200, "HIT", "TCP_MEM_HIT/200", 3),
        ]),
        ("min-fresh asks for more freshness than is left", vec![
            step(GET, "/p?cc=max-age=60&etag=v1", 200, "MISS", "TCP_MISS/200", 1),
            step(GET, "/p?cc=max-age=60&etag=v1", 200, "HIT", "TCP_REFRESH_UNMODIFIED/200", 2).with(&[("cache-control", "min-fresh=120")]),
        ]),
        ("max-stale accepts a stale response", vec![
            step(GET, "/q?cc=max-age=1&etag=v1", 200, "MISS", "TCP_MISS/200", 1),
            step(GET, "/q?cc=max-age=1&etag=v1", 200, "HIT", "TCP_MEM_HIT/200", 1).after(2100).with(&[("cache-control", "max-stale=60")]),
            step(GET, "/q?cc=max-age=1&etag=v1", 200, "HIT", "TCP_REFRESH_UNMODIFIED/200", 2),
        ]),
        ("only-if-cached: 504 on a miss, served when stored", vec![
            step(GET, "/r?cc=max-age=60", 504, "MISS", "TCP_MISS/504", 0).with(&[("cache-control", "only-if-cached")]),
            step(GET, "/r?cc=max-age=60", 200, "MISS", "TCP_MISS/200", 1),
            step(GET, "/r?cc=max-age=60", 200, "HIT", "TCP_MEM_HIT/200", 1).with(&[("cache-control", "only-if-cached")]),
        ]),
        ("stale-while-revalidate serves stale and refreshes in the background", vec![
            step(GET, "/s?cc=max-age=2,stale-while-revalidate=60&etag=v1", 200, "MISS", "TCP_MISS/200", 1),
            step(GET, "/s?cc=max-age=2,stale-while-revalidate=60&etag=v1", 200, "HIT", "TCP_STALE_HIT/200", 1).after(3100).slack(1),
            step(GET, "/s?cc=max-age=2,stale-while-revalidate=60&etag=v1", 200, "HIT", "TCP_MEM_HIT/200", 2).after(300),
        ]),
        ("client conditionals are answered from the store", vec![
            step(GET, "/t?cc=max-age=60&etag=v1&lm=1000", 200, "MISS", "TCP_MISS/200", 1),
            step(GET, "/t?cc=max-age=60&etag=v1&lm=1000", 304, "HIT", "TCP_INM_HIT/304", 1).with(&[("if-none-match", "\"v1\"")]).len(0),
            step(GET, "/t?cc=max-age=60&etag=v1&lm=1000", 200, "HIT", "TCP_MEM_HIT/200", 1).with(&[("if-none-match", "\"v2\"")]),
        ]),
        ("a status without explicit freshness that is not heuristically cacheable, and chunked bodies", vec![
            step(GET, "/w?status=500&lm=100000", 500, "MISS", "TCP_MISS/500", 1),
            step(GET, "/w?status=500&lm=100000", 500, "MISS", "TCP_MISS/500", 2),
            step(GET, "/w2?status=302&lm=100000", 302, "MISS", "TCP_MISS/302", 1),
            step(GET, "/w2?status=302&lm=100000", 302, "MISS", "TCP_MISS/302", 2),
            step(GET, "/x?size=70000&chunked=1&cc=max-age=60", 200, "MISS", "TCP_MISS/200", 1).len(70000),
            step(GET, "/x?size=70000&chunked=1&cc=max-age=60", 200, "HIT", "TCP_MEM_HIT/200", 1).len(70000),
        ]),
        // RFC 9111 §4.1: `*` anywhere in the Vary list, on any line, is never matched.
        ("Vary with * among other members is never reused", vec![
            step(GET, "/va?cc=max-age=60&vary=Foo,%20*", 200, "MISS", "TCP_MISS/200", 1),
            step(GET, "/va?cc=max-age=60&vary=Foo,%20*", 200, "MISS", "TCP_MISS/200", 2),
            step(GET, "/vb?cc=max-age=60&vary=*,%20Foo", 200, "MISS", "TCP_MISS/200", 1),
            step(GET, "/vb?cc=max-age=60&vary=*,%20Foo", 200, "MISS", "TCP_MISS/200", 2),
            step(GET, "/vc?cc=max-age=60&vary=*,%20*", 200, "MISS", "TCP_MISS/200", 1),
            step(GET, "/vc?cc=max-age=60&vary=*,%20*", 200, "MISS", "TCP_MISS/200", 2),
            step(GET, "/vd?cc=max-age=60&vary=,%20*", 200, "MISS", "TCP_MISS/200", 1),
            step(GET, "/vd?cc=max-age=60&vary=,%20*", 200, "MISS", "TCP_MISS/200", 2),
            step(GET, "/ve?cc=max-age=60&hdr=Vary:Foo&hdr=Vary:*", 200, "MISS", "TCP_MISS/200", 1),
            step(GET, "/ve?cc=max-age=60&hdr=Vary:Foo&hdr=Vary:*", 200, "MISS", "TCP_MISS/200", 2),
        ]),
        // RFC 9111 §5.2: directive names are case-insensitive.
        ("Cache-Control directive names are case-insensitive", vec![
            step(GET, "/ci1?cc=MaX-AgE=60", 200, "MISS", "TCP_MISS/200", 1),
            step(GET, "/ci1?cc=MaX-AgE=60", 200, "HIT", "TCP_MEM_HIT/200", 1),
            step(GET, "/ci2?cc=max-age=60,%20No-CaChE&etag=v1", 200, "MISS", "TCP_MISS/200", 1),
            step(GET, "/ci2?cc=max-age=60,%20No-CaChE&etag=v1", 200, "HIT", "TCP_REFRESH_UNMODIFIED/200", 2),
            step(GET, "/ci3?cc=max-age=60,%20NO-STORE", 200, "MISS", "TCP_MISS/200", 1),
            step(GET, "/ci3?cc=max-age=60,%20NO-STORE", 200, "MISS", "TCP_MISS/200", 2),
            step(GET, "/ci4?cc=max-age=60,%20Private", 200, "MISS", "TCP_MISS/200", 1),
            step(GET, "/ci4?cc=max-age=60,%20Private", 200, "MISS", "TCP_MISS/200", 2),
            // A request's directives too.
            step(GET, "/ci1?cc=MaX-AgE=60", 200, "MISS", "TCP_REFRESH_MODIFIED/200", 2).with(&[("cache-control", "No-Cache")]),
        ]),
        // RFC 9111 §5.3: an invalid Expires means already expired, not "no Expires".
        // (An ETag validates it: the origin's Last-Modified moves with the clock, so an
        // If-Modified-Since sent in the next second would not match it.)
        ("an invalid Expires is already expired", vec![
            step(GET, "/ex1?hdr=Expires:Thu,%20%2001%20Jan%202099%2000:00:00%20GMT&etag=v1", 200, "MISS", "TCP_MISS/200", 1),
            step(GET, "/ex1?hdr=Expires:Thu,%20%2001%20Jan%202099%2000:00:00%20GMT&etag=v1", 200, "HIT", "TCP_REFRESH_UNMODIFIED/200", 2),
            step(GET, "/ex2?hdr=Expires:0", 200, "MISS", "TCP_MISS/200", 1),
            step(GET, "/ex2?hdr=Expires:0", 200, "MISS", "TCP_MISS/200", 2),
        ]),
        ("Expires in the obsolete RFC 850 and asctime formats", vec![
            step(GET, "/ex3?hdr=Expires:Sunday,%2001-Jan-40%2000:00:00%20GMT", 200, "MISS", "TCP_MISS/200", 1),
            step(GET, "/ex3?hdr=Expires:Sunday,%2001-Jan-40%2000:00:00%20GMT", 200, "HIT", "TCP_MEM_HIT/200", 1),
            step(GET, "/ex4?hdr=Expires:Sun%20Jan%20%201%2000:00:00%202090", 200, "MISS", "TCP_MISS/200", 1),
            step(GET, "/ex4?hdr=Expires:Sun%20Jan%20%201%2000:00:00%202090", 200, "HIT", "TCP_MEM_HIT/200", 1),
        ]),
        // RFC 9111 §5.1 / §4.2.3: an Age that is not one non-negative integer makes it stale.
        ("an invalid Age makes the stored response stale", vec![
            step(GET, "/ag1?cc=max-age=600&etag=v1&hdr=Age:old,%200", 200, "MISS", "TCP_MISS/200", 1),
            step(GET, "/ag1?cc=max-age=600&etag=v1&hdr=Age:old,%200", 200, "HIT", "TCP_REFRESH_UNMODIFIED/200", 2),
            step(GET, "/ag2?cc=max-age=600&etag=v1&hdr=Age:abc", 200, "MISS", "TCP_MISS/200", 1),
            step(GET, "/ag2?cc=max-age=600&etag=v1&hdr=Age:abc", 200, "HIT", "TCP_REFRESH_UNMODIFIED/200", 2),
            step(GET, "/ag3?cc=max-age=600&hdr=Age:abc", 200, "MISS", "TCP_MISS/200", 1),
            step(GET, "/ag3?cc=max-age=600&hdr=Age:abc", 200, "MISS", "TCP_MISS/200", 2),
        ]),
        // RFC 9111 §3.1: Set-Cookie is stored with the response and served on hits.
        ("Set-Cookie is stored and a fresh response carrying it reused", vec![
            step(GET, "/ck?cc=max-age=60&setcookie=1", 200, "MISS", "TCP_MISS/200", 1).expect("set-cookie", "lab=1; Path=/"),
            step(GET, "/ck?cc=max-age=60&setcookie=1", 200, "HIT", "TCP_MEM_HIT/200", 1).expect("set-cookie", "lab=1; Path=/"),
        ]),
        // RFC 9111 §3: any final status with explicit freshness; heuristics only for some.
        ("fresh responses of any final status with explicit freshness are reused", vec![
            step(GET, "/fs1?status=299&cc=max-age=60", 299, "MISS", "TCP_MISS/299", 1),
            step(GET, "/fs1?status=299&cc=max-age=60", 299, "HIT", "TCP_MEM_HIT/299", 1),
            step(GET, "/fs2?status=400&cc=max-age=60", 400, "MISS", "TCP_MISS/400", 1),
            step(GET, "/fs2?status=400&cc=max-age=60", 400, "HIT", "TCP_MEM_HIT/400", 1),
            step(GET, "/fs3?status=503&cc=max-age=60", 503, "MISS", "TCP_MISS/503", 1),
            step(GET, "/fs3?status=503&cc=max-age=60", 503, "HIT", "TCP_MEM_HIT/503", 1),
            step(GET, "/fs4?status=599&cc=max-age=60", 599, "MISS", "TCP_MISS/599", 1),
            step(GET, "/fs4?status=599&cc=max-age=60", 599, "HIT", "TCP_MEM_HIT/599", 1),
            step(GET, "/fs5?status=410&lm=100000", 410, "MISS", "TCP_MISS/410", 1),
            step(GET, "/fs5?status=410&lm=100000", 410, "HIT", "TCP_MEM_HIT/410", 1),
        ]),
        // RFC 9111 §5.2.2.3.
        ("must-understand: stored over no-store for a status the cache understands", vec![
            step(GET, "/mu1?cc=must-understand,%20no-store,%20max-age=60", 200, "MISS", "TCP_MISS/200", 1),
            step(GET, "/mu1?cc=must-understand,%20no-store,%20max-age=60", 200, "HIT", "TCP_MEM_HIT/200", 1),
            step(GET, "/mu2?status=299&cc=must-understand,%20no-store,%20max-age=60", 299, "MISS", "TCP_MISS/299", 1),
            step(GET, "/mu2?status=299&cc=must-understand,%20no-store,%20max-age=60", 299, "MISS", "TCP_MISS/299", 2),
        ]),
        // RFC 9111 §4.3.1: a weak ETag validates too (the strong one is in the scenarios above).
        ("revalidation with a weak ETag", vec![
            step(GET, "/wv?cc=max-age=1&etag=W/%22w1%22", 200, "MISS", "TCP_MISS/200", 1),
            step(GET, "/wv?cc=max-age=1&etag=W/%22w1%22", 200, "HIT", "TCP_REFRESH_UNMODIFIED/200", 2).after(2100),
        ]),
        // RFC 9110 §13.1.3: a fresh stored response without Last-Modified still answers an
        // If-Modified-Since by its Date.
        ("a client's If-Modified-Since answered without Last-Modified", vec![
            step(GET, "/im?cc=max-age=60", 200, "MISS", "TCP_MISS/200", 1),
            step(GET, "/im?cc=max-age=60", 304, "HIT", "TCP_IMS_HIT/304", 1).with(&[("if-modified-since", "Fri, 01 Jan 2094 00:00:00 GMT")]).len(0),
        ]),
        // RFC 9111 §4.1 allows normalising the selecting fields' values.
        ("Accept-Language is normalised for Vary matching", vec![
            step(GET, "/al?cc=max-age=60&vary=Accept-Language", 200, "MISS", "TCP_MISS/200", 1).with(&[("accept-language", "en-US, fr;q=0.5")]),
            step(GET, "/al?cc=max-age=60&vary=Accept-Language", 200, "HIT", "TCP_MEM_HIT/200", 1).with(&[("accept-language", "fr;q=0.50, en-us")]),
            step(GET, "/al?cc=max-age=60&vary=Accept-Language", 200, "MISS", "TCP_MISS/200", 2).with(&[("accept-language", "fr, en-us;q=0.5")]),
        ]),
        // A no-cache response may not be served stale even when the client allows it.
        ("no-cache is validated even under max-stale", vec![
            step(GET, "/nm?cc=no-cache&etag=v1", 200, "MISS", "TCP_MISS/200", 1),
            step(GET, "/nm?cc=no-cache&etag=v1", 200, "HIT", "TCP_REFRESH_UNMODIFIED/200", 2).with(&[("cache-control", "max-stale=600")]),
        ]),
        // RFC 9111 §3.3 / §3.4: a 206 is kept; a range inside it is answered from it; a GET
        // for the whole asks only for the rest (the origin counts one more request) and the
        // two parts are served and stored as one 200, checked byte for byte.
        ("partial content is stored, reused, and completed by a range request", vec![
            step(GET, "/pc?size=1000&cc=max-age=60&etag=p1&ranges=1", 206, "MISS", "TCP_MISS/206", 1).with(&[("range", "bytes=0-499")]).len(500).expect("content-range", "bytes 0-499/1000"),
            step(GET, "/pc?size=1000&cc=max-age=60&etag=p1&ranges=1", 206, "HIT", "TCP_MEM_HIT/206", 1).with(&[("range", "bytes=100-199")]).len(100).expect("content-range", "bytes 100-199/1000"),
            step(GET, "/pc?size=1000&cc=max-age=60&etag=p1&ranges=1", 200, "MISS", "TCP_MISS/200", 2).len(1000).expect("cache-status", "testcache; fwd=partial; stored*"),
            step(GET, "/pc?size=1000&cc=max-age=60&etag=p1&ranges=1", 200, "HIT", "TCP_MEM_HIT/200", 2).len(1000),
            step(GET, "/pc?size=1000&cc=max-age=60&etag=p1&ranges=1", 206, "HIT", "TCP_MEM_HIT/206", 2).with(&[("range", "bytes=900-")]).len(100),
            // A range the pieces do not hold goes upstream.
            step(GET, "/pc2?size=1000&cc=max-age=60&etag=p1&ranges=1", 206, "MISS", "TCP_MISS/206", 1).with(&[("range", "bytes=0-99")]).len(100),
            step(GET, "/pc2?size=1000&cc=max-age=60&etag=p1&ranges=1", 206, "MISS", "TCP_MISS/206", 2).with(&[("range", "bytes=50-149")]).len(100),
            step(GET, "/pc2?size=1000&cc=max-age=60&etag=p1&ranges=1", 206, "HIT", "TCP_MEM_HIT/206", 2).with(&[("range", "bytes=20-139")]).len(120),
            // A weak ETag cannot combine pieces: nothing is kept.
            step(GET, "/pc3?size=1000&cc=max-age=60&etag=W/%22w%22&ranges=1", 206, "MISS", "TCP_MISS/206", 1).with(&[("range", "bytes=0-99")]).len(100),
            step(GET, "/pc3?size=1000&cc=max-age=60&etag=W/%22w%22&ranges=1", 206, "MISS", "TCP_MISS/206", 2).with(&[("range", "bytes=0-99")]).len(100),
        ]),
        // RFC 9111 §4.3.5: a HEAD's 200 that agrees with a stale stored GET response freshens it.
        ("a HEAD freshens a stale stored GET response", vec![
            step(GET, "/hf?cc=max-age=1&etag=v1&size=10", 200, "MISS", "TCP_MISS/200", 1).len(10),
            step("HEAD", "/hf?cc=max-age=1&etag=v1&size=10", 200, "MISS", "TCP_MISS/200", 2).after(2100).len(0),
            step(GET, "/hf?cc=max-age=1&etag=v1&size=10", 200, "HIT", "TCP_MEM_HIT/200", 2).len(10),
        ]),
        ("objects over max_object_size are relayed whole but not stored", vec![
            step(GET, "/y?size=300000&cc=max-age=60", 200, "MISS", "TCP_MISS/200", 1).len(300000),
            step(GET, "/y?size=300000&cc=max-age=60", 200, "MISS", "TCP_MISS/200", 2).len(300000),
            step(GET, "/y2?size=300000&chunked=1&cc=max-age=60", 200, "MISS", "TCP_MISS/200", 1).len(300000),
            step(GET, "/y2?size=300000&chunked=1&cc=max-age=60", 200, "MISS", "TCP_MISS/200", 2).len(300000),
        ]),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caching_rules() {
    // Scenarios run concurrently, each with its own proxy and origin.
    let mut tasks = Vec::new();
    for (name, steps) in scenarios() {
        tasks.push(tokio::spawn(async move { run(name, steps).await }));
    }
    let mut failures = Vec::new();
    for t in tasks {
        if let Err(e) = t.await.expect("scenario task") {
            failures.push(e);
        }
    }
    assert!(
        failures.is_empty(),
        "{} scenario(s) failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

async fn run(name: &str, steps: Vec<Step>) -> Result<(), String> {
    let origin = Origin::start().await.map_err(|e| e.to_string())?;
    let proxy = node(|c| c.store.max_object_size = 200_000).await;
    for (i, s) in steps.iter().enumerate() {
        let at = format!("[{name}] step {} ({} {})", i + 1, s.method, s.path);
        if s.wait_ms > 0 {
            tokio::time::sleep(Duration::from_millis(s.wait_ms)).await;
        }
        let reply = request(proxy.addr, s.method, &origin.url(s.path), s.headers).await;
        let code = proxy.log_code(i + 1).await;
        let hits = origin.hits(s.path);
        let mut problems = Vec::new();
        if reply.status != s.status {
            problems.push(format!("status {} != {}", reply.status, s.status));
        }
        if reply.x_cache() != s.x_cache {
            problems.push(format!(
                "X-Cache {:?} != {}",
                reply.header("x-cache"),
                s.x_cache
            ));
        }
        if code != s.log {
            problems.push(format!("log {code} != {}", s.log));
        }
        if !(s.origin_hits..=s.origin_hits + s.slack).contains(&hits) {
            problems.push(format!(
                "origin hits {hits} != {} (+{})",
                s.origin_hits, s.slack
            ));
        }
        if let Some((h, want)) = s.expect_header {
            let got = reply.header(h);
            let ok = want.split('|').any(|want| match want.strip_suffix('*') {
                Some(prefix) => got.starts_with(prefix),
                None => got == want,
            });
            if !ok {
                problems.push(format!("{h}: {got:?} != {want:?}"));
            }
        }
        if let Some(n) = s.body_len {
            if reply.body.len() != n {
                problems.push(format!("body {} bytes != {n}", reply.body.len()));
            } else if n > 0 && reply.status == 200 && reply.body != meshcache_lab::expected_body(n)
            {
                problems.push("body content differs from the origin's".into());
            }
        }
        // Cache-Status (RFC 9211): our entry says hit for a stored answer, how we forwarded
        // for anything fetched.
        let cache_status = reply.header("cache-status");
        let want = if reply.x_cache().starts_with("HIT") {
            "testcache; hit"
        } else {
            "testcache; fwd="
        };
        let revalidated = cache_status.starts_with("testcache; fwd=stale; fwd-status=304");
        if reply.status < 400 && !cache_status.starts_with(want) && !revalidated {
            problems.push(format!(
                "Cache-Status {cache_status:?} does not start {want:?}"
            ));
        }
        if !reply.header("via").contains("testcache") {
            problems.push(format!("Via {:?} lacks our name", reply.header("via")));
        }
        if !problems.is_empty() {
            return Err(format!("{at}: {}", problems.join("; ")));
        }
    }
    proxy.stop().await;
    Ok(())
}

/// An origin for the invalidation scenario: a GET gets its path back, fresh for 60 s; any other
/// method gets the status its `X-Status` header asks for (201 if none), and its `X-Location` and
/// `X-Content-Location` headers back as `Location` and `Content-Location`. Requests are counted
/// by path.
struct EchoOrigin {
    addr: std::net::SocketAddr,
    hits: std::sync::Arc<parking_lot::Mutex<std::collections::HashMap<String, u64>>>,
}

impl EchoOrigin {
    async fn start(ip: &str) -> EchoOrigin {
        EchoOrigin::serve(tokio::net::TcpListener::bind((ip, 0)).await.expect("bind"))
    }

    fn serve(listener: tokio::net::TcpListener) -> EchoOrigin {
        let origin = EchoOrigin {
            addr: listener.local_addr().expect("addr"),
            hits: Default::default(),
        };
        let hits = origin.hits.clone();
        tokio::spawn(async move {
            for _ in 0..64 {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let hits = hits.clone();
                let svc =
                    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        *hits.lock().entry(req.uri().path().to_owned()).or_default() += 1;
                        let asked =
                            |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok());
                        let mut resp = http::Response::builder();
                        if req.method() == http::Method::GET {
                            resp = resp.status(200).header("cache-control", "max-age=60");
                        } else {
                            resp = resp.status(
                                asked("x-status").map_or(201, |s| s.parse().expect("status")),
                            );
                            for (from, to) in [
                                ("x-location", "location"),
                                ("x-content-location", "content-location"),
                            ] {
                                if let Some(v) = asked(from) {
                                    resp = resp.header(to, v);
                                }
                            }
                        }
                        let body = bytes::Bytes::from(req.uri().path().to_owned());
                        std::future::ready(resp.body(http_body_util::Full::new(body)))
                    });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc),
                );
            }
        });
        origin
    }

    fn hits(&self, path: &str) -> u64 {
        self.hits.lock().get(path).copied().unwrap_or(0)
    }
}

/// One request of the invalidation scenario: method, origin, path, request headers, then the
/// status, X-Cache verdict and the origin's count of requests for the path expected after it.
type Visit<'a> = (
    &'a str,
    &'a EchoOrigin,
    &'a str,
    Vec<(&'a str, String)>,
    u16,
    &'a str,
    u64,
);

/// RFC 9111 §4.4 end to end: a non-error response to an unsafe method invalidates the URLs in
/// its `Location` and `Content-Location` (absolute, or relative to the request's URL) when they
/// are on the request's origin, and only then: the same paths on another host, or on the same
/// host at another port, stay cached; an error response invalidates nothing, not even the URL
/// it answered.
#[tokio::test]
async fn unsafe_methods_invalidate_location_and_content_location_on_the_same_origin() {
    // A: the origin written to; B: another host at the same port; C: the same host at another
    // port. (A port free on both addresses is found in a few tries.)
    let mut pair = None;
    for _ in 0..20 {
        let first = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = first.local_addr().expect("addr").port();
        if let Ok(second) = tokio::net::TcpListener::bind(("127.0.0.2", port)).await {
            pair = Some((first, second));
            break;
        }
    }
    let (first, second) = pair.expect("a port free on 127.0.0.1 and 127.0.0.2");
    let (a, b) = (EchoOrigin::serve(first), EchoOrigin::serve(second));
    let c = EchoOrigin::start("127.0.0.1").await;
    let proxy = node(|_| {}).await;
    let (aa, ba, ca) = (a.addr, b.addr, c.addr);
    let none = Vec::new;
    #[rustfmt::skip]
    let steps: Vec<Visit> = vec![
        ("GET", &a, "/a", none(), 200, "MISS", 1),
        ("GET", &a, "/b", none(), 200, "MISS", 1),
        ("GET", &a, "/d/e", none(), 200, "MISS", 1),
        ("GET", &b, "/a", none(), 200, "MISS", 1),
        ("GET", &c, "/a", none(), 200, "MISS", 1),
        ("GET", &a, "/a", none(), 200, "HIT", 1),
        ("GET", &a, "/b", none(), 200, "HIT", 1),
        ("GET", &a, "/d/e", none(), 200, "HIT", 1),
        ("GET", &b, "/a", none(), 200, "HIT", 1),
        ("GET", &c, "/a", none(), 200, "HIT", 1),
        // Same origin: both named URLs go, nothing else.
        ("POST", &a, "/x", vec![("x-location", "/a".into()), ("x-content-location", format!("http://{aa}/b"))], 201, "MISS", 1),
        ("GET", &a, "/a", none(), 200, "MISS", 2),
        ("GET", &a, "/b", none(), 200, "MISS", 2),
        ("GET", &a, "/d/e", none(), 200, "HIT", 1),
        ("GET", &b, "/a", none(), 200, "HIT", 1),
        ("GET", &c, "/a", none(), 200, "HIT", 1),
        ("GET", &a, "/a", none(), 200, "HIT", 2),
        ("GET", &a, "/b", none(), 200, "HIT", 2),
        // A relative-path reference resolves against the request's URL; a 3xx is no error.
        ("POST", &a, "/d/x", vec![("x-status", "303".into()), ("x-location", "e".into())], 303, "MISS", 1),
        ("GET", &a, "/d/e", none(), 200, "MISS", 2),
        ("GET", &a, "/d/e", none(), 200, "HIT", 2),
        // Other origins: another host, the same host at another port. Nothing goes.
        ("POST", &a, "/y", vec![("x-location", format!("http://{ba}/a")), ("x-content-location", format!("http://{ca}/a"))], 201, "MISS", 1),
        ("GET", &b, "/a", none(), 200, "HIT", 1),
        ("GET", &c, "/a", none(), 200, "HIT", 1),
        ("GET", &a, "/a", none(), 200, "HIT", 2),
        // An error response: neither its URL nor the one it names goes.
        ("POST", &a, "/a", vec![("x-status", "500".into()), ("x-location", "/b".into())], 500, "MISS", 3),
        ("GET", &a, "/a", none(), 200, "HIT", 3),
        ("GET", &a, "/b", none(), 200, "HIT", 2),
        // The same request answered 2xx: its URL goes.
        ("POST", &a, "/a", vec![("x-location", "/b".into())], 201, "MISS", 4),
        ("GET", &a, "/a", none(), 200, "MISS", 5),
        ("GET", &a, "/b", none(), 200, "MISS", 3),
    ];
    for (i, (method, origin, path, headers, status, x_cache, hits)) in steps.iter().enumerate() {
        let url = format!("http://{}{path}", origin.addr);
        let at = format!("step {} ({method} {url} {headers:?})", i + 1);
        let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let reply = request(proxy.addr, method, &url, &headers).await;
        assert_eq!(reply.status, *status, "{at}");
        assert_eq!(reply.x_cache(), *x_cache, "{at}: {:?}", reply.headers);
        let cache_status = reply.header("cache-status");
        let want = if *x_cache == "HIT" {
            "testcache; hit"
        } else {
            "testcache; fwd="
        };
        assert!(
            cache_status.starts_with(want),
            "{at}: Cache-Status {cache_status:?}"
        );
        assert_eq!(origin.hits(path), *hits, "{at}: origin requests for {path}");
    }
    proxy.stop().await;
}
