//! # meshcache-lab
//!
//! The evaluation lab of meshcache, a cooperative web proxy cache: the tool
//! that decides, by measurement, how a set of caches should cooperate — with
//! meshcache *or Squid* as the system under test (the hierarchy-evaluation
//! paper's framework, with the measurements of the Summary Cache,
//! directory-protocol and trans-Pacific papers).
//!
//! ## Layout
//!
//! | module | what it is |
//! | --- | --- |
//! | [`origin`] | the origin emulator: bodies of the requested size, delays, cacheability, validators |
//! | [`client`] | the client emulator: N clients with bounded outstanding requests, latency histograms, outcomes from `X-Cache` |
//! | [`link`] | user-space link emulation (delay, jitter, loss, bandwidth) for TCP and UDP |
//! | [`experiment`] | the experiment file (`meshcache lab run EXPERIMENT.toml`) and its validation |
//! | `topology` | flat, 3.1, 2.2, 2.2.dom, pair, and custom cache graphs |
//! | `node` | nodes' addresses, generated configs (meshcache TOML, squid.conf) and processes |
//! | `squid_user` | who a Squid node runs as (as root: the user it drops to), and what that user may do with a folder |
//! | [`folders`] | the folders the lab creates on the way to its nodes' folders, enterable by Squid's user |
//! | [`preflight`] | before a run: programs, Squid's user and folders, CPUs and listening addresses, one line per problem |
//! | `measure` | CPU, UDP/TCP counters and the nodes' own counters, before and after a measured phase |
//! | `tcpcount` | TCP segments sent and received per node, from the kernel's per-socket counters (sock_diag) |
//! | `replay` | a workload's requests split into per-node jobs and replayed by the client emulator |
//! | [`run`] | the runner: workloads and the pre-flight check, then origins, links, nodes, warm-up, measured replay, teardown |
//! | [`results`] | what a run measured (`results.json`) |
//! | [`report`] | `results.md` (Table 2 shaped), the Hit Ratio Efficiency Graph and latency plots |
//!
//! The workloads the clients replay come from `meshcache-workload`.
//!
//! ## The origin emulator
//!
//! [`Origin`] is a fast HTTP/1.1 origin server whose responses are entirely
//! controlled by the request's query string, so that tests and benchmarks
//! need no route table: the path is free, and
//! `GET /any/path?size=4096&cc=max-age=60&etag=v1` answers 200 with a
//! 4096-byte body, `Cache-Control: max-age=60` and `ETag: "v1"`.
//!
//! * [`Origin::start`] binds `127.0.0.1:0` and serves until the last
//!   [`Origin`] handle is dropped; [`Origin::spawn`] serves an
//!   already-bound listener until a shutdown future resolves (or the last
//!   handle is dropped).
//! * [`Origin::url`] builds request URLs, [`Origin::hits`] and
//!   [`Origin::total`] tell how many requests the origin received.
//! * [`run_origin`] runs one in the foreground until ctrl-c or SIGTERM (the
//!   `meshcache lab origin --listen ADDR` command).
//! * Server-level defaults, for what the query string leaves out:
//!   [`origin::OriginConfig`] sets a reply delay (fixed, or drawn from a
//!   uniform, exponential or log-normal distribution with a seed; the URL's
//!   `delay_ms` overrides it), a default `Cache-Control` (when no `cc`),
//!   `Last-Modified` (when no `lm`) and an `ETag` derived from the path and
//!   query (when no `etag`). Use [`Origin::start_with`],
//!   [`Origin::spawn_with`] or [`origin::run_origin_with`]; `Default` is the
//!   behaviour described here.
//!
//! ### Query parameters (GET and HEAD)
//!
//! All are optional; unknown parameters are ignored, so any extra parameter
//! (`&v=2`) makes a distinct URL with the same response. Names and values are
//! percent-decoded, and `+` decodes to a space (write `%2B` for a plus). A
//! value keeps everything after the first `=`, so `cc=max-age=60` needs no
//! escaping. When a parameter is repeated, the last one wins, except `hdr`.
//! A malformed value answers `400 Bad Request` with the reason as the body.
//!
//! | parameter | effect |
//! | --- | --- |
//! | `size=N` | body of `N` bytes (default 0, at most [`MAX_SIZE`] = 1 GiB; larger is refused with 400). The bytes are deterministic: byte `i` is [`body_byte`]`(i)`, the pattern `abcdefghijklmnopqrstuvwxyz0123456789\n` repeated from offset 0; [`expected_body`] builds the whole body. |
//! | `cc=V` | `Cache-Control: V` |
//! | `expires=SECS` | `Expires:` the response's `Date` + `SECS` (may be negative: already expired) |
//! | `lm=SECS` | `Last-Modified:` the response's `Date` − `SECS` (negative: in the future) |
//! | `etag=X` | `ETag: "X"`; a value that is already quoted (`"X"` or `W/"X"`) is sent as is, so weak tags can be tested |
//! | `vary=H` | `Vary: H` |
//! | `status=NNN` | status code (default 200; 200–999) |
//! | `delay_ms=N` | wait `N` ms before sending the response head (instead of the configured default delay) |
//! | `stall_ms=N` | send the head, then wait `N` ms before the body |
//! | `chunked=1` | send the body with chunked transfer-coding (a stream of unknown length, in chunks of at most 64 KiB) instead of `Content-Length`; a bare `chunked` also counts, `chunked=0` turns it off |
//! | `ct=T` | `Content-Type: T` (default `application/octet-stream`) |
//! | `text=T` | the body starts with the text `T` (percent-decoded; `%0A` for a new line) and goes on with the pattern bytes, from offset `len(T)`, up to `size` (at least `T` itself). Not with `chunked` or `stall_ms`. |
//! | `setcookie=1` | adds `Set-Cookie: lab=N; Path=/` (`N` as in `x-origin-count`) |
//! | `ranges=1` | honours a single-range `Range` (with `If-Range` naming the ETag, or none) with a 206 and `Content-Range`; without it `Range` is ignored and the whole sent |
//! | `hdr=Name:Value` | adds the header `Name: Value`; repeatable. It replaces a header of the same name that the emulator would send (repeated `hdr`s of one name all appear). Framing headers (`Content-Length`, `Transfer-Encoding`) are hyper's business: do not set them. |
//!
//! ### Behaviour
//!
//! * **Conditional requests** (GET and HEAD, when the status is 2xx): an
//!   `If-None-Match` listing the ETag (weak comparison) or `*` answers
//!   `304 Not Modified`; without `If-None-Match`, an `If-Modified-Since` at or
//!   after the `Last-Modified` (when `lm` is given) does too. A 304 carries
//!   `ETag`, `Last-Modified`, `Cache-Control`, `Expires` and `Vary` as the
//!   200 would, and no body.
//! * **`Range` is not honoured**: the full response is always sent, so a
//!   proxy's own range handling can be tested.
//! * **HEAD** gets the GET response's headers (with its `Content-Length`,
//!   unless `chunked`) and no body.
//! * **Other methods** (POST, PUT, DELETE, …) read the request body fully and
//!   answer `200` with body `ok` and `x-request-body-bytes: N`, the request
//!   body's length; the query is not interpreted. `CONNECT` is refused (405).
//! * **Every response** carries `Date` and `x-origin-count: N`, where `N` is
//!   the number of requests received for that exact path and query string,
//!   this one included.
//! * **Counting** is per path-and-query string exactly as received (of any
//!   method, malformed ones too) plus a total; see [`Origin::hits`],
//!   [`Origin::total`] and [`Origin::reset`].
//! * Absolute-form targets (`GET http://host/p?q HTTP/1.1`, as a proxy might
//!   wrongly send) are accepted, and only their path and query are used.
//! * Keep-alive, pipelining and HTTP/1.0 clients are supported; accepted
//!   sockets have `TCP_NODELAY`.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! let origin = meshcache_lab::Origin::start().await?;
//! let url = origin.url("/obj?size=1024&cc=max-age=60");
//! // ... fetch `url` through the proxy twice ...
//! assert_eq!(origin.hits("/obj?size=1024&cc=max-age=60"), 1);
//! # Ok(()) }
//! ```

pub mod barrier;
pub mod client;
pub mod experiment;
pub mod folders;
pub mod link;
mod measure;
mod node;
pub mod origin;
pub mod pin;
pub mod preflight;
mod replay;
pub mod report;
pub mod results;
pub mod run;
mod squid_user;
mod tcpcount;
mod topology;

pub use link::{Link, LinkConfig};
pub use origin::{
    body_byte, expected_body, run_origin, Delay, Origin, OriginConfig, OriginError, MAX_SIZE,
};
