//! RFC 9110 / 9111 on the wire: what the proxy sends and relays when the origin speaks an
//! older version, sends interim responses, varies, or answers a POST with a response a GET
//! may reuse. The origin is scripted byte by byte and records what reached it; clients are
//! raw sockets where the exact status line matters. Real sockets on loopback only.

mod common;

use std::time::Duration;

use common::scripted::{head, reply, Scripted};
use common::{node, raw, request, Node};
use meshcache_store::StoreEvent;

/// A raw request through the proxy for `url` on `origin`, closing after the response: the
/// whole response as text, status line first.
async fn raw_request(
    proxy: &Node,
    origin: &Scripted,
    method: &str,
    url: &str,
    extra: &str,
) -> String {
    let req = format!(
        "{method} {url} HTTP/1.1\r\nHost: {}\r\n{extra}Connection: close\r\n\r\n",
        origin.addr
    );
    raw(proxy.addr, req.as_bytes()).await
}

/// The fields of a raw response's head (names lower-cased), before the empty line.
fn raw_fields(response: &str) -> Vec<(String, String)> {
    let head = response.split("\r\n\r\n").next().unwrap_or("");
    head.split("\r\n")
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.to_ascii_lowercase(), v.trim().to_owned()))
        .collect()
}

/// The body of a raw response (what follows the head), de-chunked when chunked.
fn raw_body(response: &str) -> String {
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((response, ""));
    if !head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return body.to_owned();
    }
    let mut out = String::new();
    let mut rest = body;
    for _ in 0..1000 {
        let Some((size, after)) = rest.split_once("\r\n") else {
            break;
        };
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || after.len() < n {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
    out
}

#[tokio::test]
async fn a_response_from_an_http_1_0_origin_goes_out_as_http_1_1() {
    let origin = Scripted::start(8, |seen, _| match seen.target() {
        "/sized" => reply(
            "HTTP/1.0 200 OK",
            &[
                ("Cache-Control", "max-age=60"),
                ("Content-Type", "text/plain"),
            ],
            b"from a 1.0 origin",
        ),
        // HTTP/1.0 without Content-Length: the body ends when the origin closes.
        _ => {
            let mut out = head("HTTP/1.0 200 OK", &[("Cache-Control", "max-age=60")]);
            out.extend_from_slice(b"delimited by close");
            out
        }
    })
    .await;
    let proxy = node(|_| {}).await;
    let mut line = 0;
    for (path, body) in [
        ("/sized", "from a 1.0 origin"),
        ("/close", "delimited by close"),
    ] {
        let url = origin.url(path);
        for code in ["TCP_MISS/200", "TCP_MEM_HIT/200"] {
            let got = raw_request(&proxy, &origin, "GET", &url, "").await;
            assert!(
                got.starts_with("HTTP/1.1 200 OK\r\n"),
                "{code} {path}: {got}"
            );
            assert_eq!(raw_body(&got), body, "{code} {path}: {got}");
            line += 1;
            assert_eq!(proxy.log_code(line).await, code, "{path}");
        }
        assert_eq!(origin.count("GET", path), 1, "{path}: the second was a hit");
    }
    proxy.stop().await;
}

/// The field `Via` of a raw response (its last entry is this node's).
fn raw_via(response: &str) -> String {
    raw_fields(response)
        .into_iter()
        .filter(|(n, _)| n == "via")
        .map(|(_, v)| v)
        .collect::<Vec<_>>()
        .join(", ")
}

#[tokio::test]
async fn via_names_the_version_each_message_was_received_in() {
    // RFC 9110 §7.6.3: a Via entry's protocol is that of the message as this node received
    // it. An HTTP/1.0 request goes upstream with "1.0 NAME"; an HTTP/1.0 origin's response
    // reaches the client with "1.0 NAME"; HTTP/1.1 messages, and hits (made here), say "1.1".
    let origin = Scripted::start(8, |seen, _| {
        let status = if seen.target().starts_with("/old") {
            "HTTP/1.0 200 OK"
        } else {
            "HTTP/1.1 200 OK"
        };
        reply(status, &[("Cache-Control", "max-age=60")], b"body")
    })
    .await;
    let proxy = node(|_| {}).await;
    let name = "meshcache/";
    for (path, client, upstream_entry, response_entry) in [
        ("/new-a", "HTTP/1.0", "1.0 ", "1.1 "),
        ("/new-b", "HTTP/1.1", "1.1 ", "1.1 "),
        ("/old-a", "HTTP/1.1", "1.1 ", "1.0 "),
    ] {
        let url = origin.url(path);
        let req = format!(
            "GET {url} {client}\r\nHost: {}\r\nConnection: close\r\n\r\n",
            origin.addr
        );
        let got = raw(proxy.addr, req.as_bytes()).await;
        assert_eq!(raw_body(&got), "body", "{path}: {got}");
        let seen = origin.requests_for("GET", path);
        let sent_via = seen[0].header("via").unwrap_or_default().to_owned();
        assert!(
            sent_via.starts_with(upstream_entry) && sent_via.contains(name),
            "{path} from an {client} client went upstream with Via: {sent_via}"
        );
        let via = raw_via(&got);
        assert!(
            via.starts_with(response_entry) && via.contains(name),
            "{path}: the miss reached the client with Via: {via}"
        );
        let hit = raw(proxy.addr, req.as_bytes()).await;
        let via = raw_via(&hit);
        assert!(via.starts_with("1.1 "), "{path}: a hit says 1.1: {via}");
        assert_eq!(origin.count("GET", path), 1, "{path}: the second was a hit");
    }
    proxy.stop().await;
}

/// The messages of a raw response stream: each interim head, then the final response (its
/// head and body).
fn split_interim(response: &str) -> (Vec<&str>, &str) {
    let mut interim = Vec::new();
    let mut rest = response;
    while rest.starts_with("HTTP/1.1 1") {
        let Some((head, after)) = rest.split_once("\r\n\r\n") else {
            break;
        };
        interim.push(head);
        rest = after;
    }
    (interim, rest)
}

/// An origin that answers with a `103 Early Hints` (a `Link`), a `102 Processing` and the final
/// response, cacheable for a minute.
async fn hinting_origin() -> Scripted {
    Scripted::start(8, |_, _| {
        let mut out = head(
            "HTTP/1.1 103 Early Hints",
            &[
                ("Link", "</style.css>; rel=preload; as=style"),
                ("Connection", "X-Hop"),
                ("X-Hop", "hop-by-hop, not forwarded"),
            ],
        );
        out.extend(head("HTTP/1.1 102 Processing", &[]));
        out.extend(reply(
            "HTTP/1.1 200 OK",
            &[
                ("Cache-Control", "max-age=60"),
                ("Content-Type", "text/plain"),
            ],
            b"the final body",
        ));
        out
    })
    .await
}

#[tokio::test]
async fn interim_responses_are_relayed_to_the_client_and_never_stored() {
    // RFC 9110 §15.2: a proxy MUST forward 1xx responses; RFC 9111 §3: they are not stored.
    let origin = hinting_origin().await;
    let proxy = node(|_| {}).await;
    let url = origin.url("/hinted");
    let got = raw_request(&proxy, &origin, "GET", &url, "").await;
    let (interim, last) = split_interim(&got);
    assert_eq!(interim.len(), 2, "the 103 and the 102, in order: {got}");
    assert!(
        interim[0].starts_with("HTTP/1.1 103 Early Hints\r\n"),
        "{got}"
    );
    let hints = raw_fields(&format!("{}\r\n\r\n", interim[0]));
    assert!(
        hints
            .iter()
            .any(|(n, v)| n == "link" && v == "</style.css>; rel=preload; as=style"),
        "the 103 carries its Link: {got}"
    );
    assert!(
        !hints.iter().any(|(n, _)| n == "x-hop" || n == "connection"),
        "hop-by-hop fields stay behind: {got}"
    );
    assert!(
        hints
            .iter()
            .any(|(n, v)| n == "via" && v.contains("meshcache/")),
        "the 103 names this hop: {got}"
    );
    assert!(
        interim[1].starts_with("HTTP/1.1 102 Processing\r\n"),
        "{got}"
    );
    assert!(last.starts_with("HTTP/1.1 200 OK\r\n"), "{got}");
    assert!(
        !raw_fields(last).iter().any(|(n, _)| n == "link"),
        "the 103's Link is not in the final response: {got}"
    );
    assert_eq!(raw_body(last), "the final body");
    assert_eq!(proxy.log_code(1).await, "TCP_MISS/200");

    // The hit: the stored response alone, without the 1xx or their fields.
    let got = raw_request(&proxy, &origin, "GET", &url, "").await;
    assert!(got.starts_with("HTTP/1.1 200 OK\r\n"), "{got}");
    assert!(!got.contains(" 103 ") && !got.contains(" 102 "), "{got}");
    assert!(!raw_fields(&got).iter().any(|(n, _)| n == "link"), "{got}");
    assert_eq!(raw_body(&got), "the final body");
    assert_eq!(proxy.log_code(2).await, "TCP_MEM_HIT/200");
    assert_eq!(origin.count("GET", "/hinted"), 1);

    // Two misses on one kept-alive connection: each gets its own 1xx, before its answer.
    let (a, b) = (origin.url("/kept-a"), origin.url("/kept-b"));
    let req = |url: &str, last: bool| {
        format!(
            "GET {url} HTTP/1.1\r\nHost: {}\r\n{}\r\n",
            origin.addr,
            if last { "Connection: close\r\n" } else { "" }
        )
    };
    let both = format!("{}{}", req(&a, false), req(&b, true));
    let got = raw(proxy.addr, both.as_bytes()).await;
    assert_eq!(
        got.matches("HTTP/1.1 103 Early Hints\r\n").count(),
        2,
        "{got}"
    );
    assert_eq!(got.matches("HTTP/1.1 200 OK\r\n").count(), 2, "{got}");
    let first_final = got.find("HTTP/1.1 200 OK").unwrap_or(0);
    let second_hint = got.rfind("HTTP/1.1 103").unwrap_or(0);
    assert!(
        second_hint > first_final,
        "the second 103 follows the first answer: {got}"
    );
    proxy.stop().await;
}

#[tokio::test]
async fn an_http_1_0_client_gets_no_interim_response_and_our_version() {
    // RFC 9110 §15.2: no 1xx to an HTTP/1.0 client; §6.2: the status line carries this
    // hop's version, 1.1, with HTTP/1.0's framing (no chunked coding).
    let origin = hinting_origin().await;
    let proxy = node(|_| {}).await;
    let url = origin.url("/old-client");
    for (n, code) in [(1, "TCP_MISS/200"), (2, "TCP_MEM_HIT/200")] {
        let req = format!("GET {url} HTTP/1.0\r\nHost: {}\r\n\r\n", origin.addr);
        let got = raw(proxy.addr, req.as_bytes()).await;
        assert!(got.starts_with("HTTP/1.1 200 OK\r\n"), "{code}: {got}");
        assert!(
            !got.contains(" 103 ") && !got.contains(" 102 "),
            "{code}: {got}"
        );
        assert!(
            !got.to_ascii_lowercase()
                .contains("transfer-encoding: chunked"),
            "{code}: {got}"
        );
        assert_eq!(raw_body(&got), "the final body", "{code}: {got}");
        assert_eq!(proxy.log_code(n).await, code);
    }
    assert_eq!(origin.count("GET", "/old-client"), 1);
    proxy.stop().await;
}

/// A script for a `Vary: Accept-Language` document with ETag `"v1"`: the first request gets
/// the German body with `cache_control`; later ones get 304 when they carry `If-None-Match`.
fn varying(cache_control: &'static str) -> impl Fn(&common::scripted::Seen, usize) -> Vec<u8> {
    move |seen, _| {
        if seen.header("if-none-match") == Some("\"v1\"") {
            return head(
                "HTTP/1.1 304 Not Modified",
                &[
                    ("ETag", "\"v1\""),
                    ("Cache-Control", "max-age=60"),
                    ("Vary", "Accept-Language"),
                    ("Connection", "close"),
                ],
            );
        }
        reply(
            "HTTP/1.1 200 OK",
            &[
                ("Cache-Control", cache_control),
                ("ETag", "\"v1\""),
                ("Vary", "Accept-Language"),
                ("Content-Type", "text/plain"),
            ],
            b"Guten Tag",
        )
    }
}

#[tokio::test]
async fn a_revalidation_carries_the_headers_vary_selected_on() {
    let origin = Scripted::start(8, varying("max-age=1")).await;
    let proxy = node(|_| {}).await;
    let url = origin.url("/greeting");
    let de = [("accept-language", "de")];
    let first = request(proxy.addr, "GET", &url, &de).await;
    assert_eq!((first.status, &first.body[..]), (200, &b"Guten Tag"[..]));
    assert_eq!(proxy.log_code(1).await, "TCP_MISS/200");
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let second = request(proxy.addr, "GET", &url, &de).await;
    assert_eq!(second.status, 200);
    assert_eq!(&second.body[..], b"Guten Tag", "the stored body, merged");
    assert_eq!(proxy.log_code(2).await, "TCP_REFRESH_UNMODIFIED/200");
    let seen = origin.wait_for("GET", "/greeting", 2).await;
    let check = &seen[1];
    assert_eq!(check.header("if-none-match"), Some("\"v1\""), "{check:?}");
    assert_eq!(check.all("accept-language"), ["de"], "{check:?}");
    // The 304's max-age=60 now applies.
    let third = request(proxy.addr, "GET", &url, &de).await;
    assert_eq!(&third.body[..], b"Guten Tag");
    assert_eq!(proxy.log_code(3).await, "TCP_MEM_HIT/200");
    assert_eq!(origin.count("GET", "/greeting"), 2);
    proxy.stop().await;
}

#[tokio::test]
async fn a_background_refresh_carries_the_headers_vary_selected_on() {
    let origin = Scripted::start(8, varying("max-age=1, stale-while-revalidate=60")).await;
    let proxy = node(|_| {}).await;
    let url = origin.url("/greeting");
    let de = [("accept-language", "de")];
    request(proxy.addr, "GET", &url, &de).await;
    assert_eq!(proxy.log_code(1).await, "TCP_MISS/200");
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let mut events = proxy.proxy.cache().subscribe();
    let stale = request(proxy.addr, "GET", &url, &de).await;
    assert_eq!((stale.status, &stale.body[..]), (200, &b"Guten Tag"[..]));
    assert_eq!(proxy.log_code(2).await, "TCP_STALE_HIT/200");
    let seen = origin.wait_for("GET", "/greeting", 2).await;
    let check = &seen[1];
    assert_eq!(check.header("if-none-match"), Some("\"v1\""), "{check:?}");
    assert_eq!(check.all("accept-language"), ["de"], "{check:?}");
    // The 304 is merged into the stored response in the background.
    for _ in 0..10 {
        let event = tokio::time::timeout(Duration::from_secs(5), events.recv())
            .await
            .expect("the refresh stored the merged response in time")
            .expect("event");
        if matches!(event, StoreEvent::Admitted { .. }) {
            break;
        }
    }
    let fresh = request(proxy.addr, "GET", &url, &de).await;
    assert_eq!(&fresh.body[..], b"Guten Tag");
    assert_eq!(proxy.log_code(3).await, "TCP_MEM_HIT/200");
    assert_eq!(origin.count("GET", "/greeting"), 2);
    proxy.stop().await;
}

/// POST answers: the POST body names which Content-Location and Cache-Control the origin sends
/// back (`CL|CC`, either may be empty); GETs get their own body.
async fn post_origin() -> Scripted {
    Scripted::start(32, |seen, _| {
        if seen.method() == "POST" {
            let asked = String::from_utf8_lossy(&seen.body).into_owned();
            let (location, cc) = asked.split_once('|').unwrap_or(("", ""));
            let mut fields = vec![
                ("Content-Type", "text/plain"),
                ("Last-Modified", "Mon, 01 Jan 2024 00:00:00 GMT"),
            ];
            if !location.is_empty() {
                fields.push(("Content-Location", location));
            }
            if !cc.is_empty() {
                fields.push(("Cache-Control", cc));
            }
            return reply("HTTP/1.1 200 OK", &fields, b"the POST result");
        }
        reply(
            "HTTP/1.1 200 OK",
            &[
                ("Cache-Control", "max-age=60"),
                ("Content-Type", "text/plain"),
            ],
            b"the GET result",
        )
    })
    .await
}

/// POSTs `body` to `url` through the proxy; the status line.
async fn post(proxy: &Node, origin: &Scripted, url: &str, body: &str) -> String {
    let extra = format!(
        "Content-Type: text/plain\r\nContent-Length: {}\r\n",
        body.len()
    );
    let req = format!(
        "POST {url} HTTP/1.1\r\nHost: {}\r\n{extra}Connection: close\r\n\r\n{body}",
        origin.addr
    );
    let got = raw(proxy.addr, req.as_bytes()).await;
    assert_eq!(raw_body(&got), "the POST result", "{got}");
    got.lines().next().unwrap_or("").to_owned()
}

#[tokio::test]
async fn a_post_response_with_its_own_content_location_and_max_age_is_reused_for_get() {
    let origin = post_origin().await;
    let proxy = node(|_| {}).await;
    let mut line = 0;
    let mut next_line = || {
        line += 1;
        line
    };
    // Relative, absolute, and with a stored GET response to replace.
    for (path, location) in [
        ("/form", "/form".to_owned()),
        ("/abs?x=1", origin.url("/abs?x=1")),
        ("/swap", "swap".to_owned()),
    ] {
        let url = origin.url(path);
        if path == "/swap" {
            request(proxy.addr, "GET", &url, &[]).await;
            assert_eq!(proxy.log_code(next_line()).await, "TCP_MISS/200");
        }
        let status = post(&proxy, &origin, &url, &format!("{location}|max-age=60")).await;
        assert!(status.starts_with("HTTP/1.1 200"), "{status}");
        assert_eq!(proxy.log_code(next_line()).await, "TCP_MISS/200");
        let got = request(proxy.addr, "GET", &url, &[]).await;
        assert_eq!(&got.body[..], b"the POST result", "{path}");
        assert_eq!(got.x_cache(), "HIT", "{path}");
        assert_eq!(
            proxy.log_code(next_line()).await,
            "TCP_MEM_HIT/200",
            "{path}"
        );
        let gets = if path == "/swap" { 1 } else { 0 };
        assert_eq!(origin.count("GET", path), gets, "{path}");
        assert_eq!(origin.count("POST", path), 1, "{path}");
    }
    proxy.stop().await;
}

#[tokio::test]
async fn a_post_response_is_not_reused_without_its_own_content_location_and_explicit_freshness() {
    let origin = post_origin().await;
    let proxy = node(|_| {}).await;
    let other = origin.url("/elsewhere");
    for (path, asked) in [
        ("/moved", "/elsewhere|max-age=60".to_owned()),
        (
            "/foreign",
            format!("http://127.0.0.2:{}/foreign|max-age=60", origin.addr.port()),
        ),
        ("/heuristic", "/heuristic|".to_owned()),
        ("/none", "|max-age=60".to_owned()),
        ("/private", "/private|private, max-age=60".to_owned()),
        ("/nostore", "/nostore|no-store, max-age=60".to_owned()),
    ] {
        let url = origin.url(path);
        post(&proxy, &origin, &url, &asked).await;
        let got = request(proxy.addr, "GET", &url, &[]).await;
        assert_eq!(&got.body[..], b"the GET result", "{path}");
        assert_eq!(got.x_cache(), "MISS", "{path}");
        assert_eq!(origin.count("GET", path), 1, "{path}");
    }
    // Nor stored under the Content-Location that differs.
    let got = request(proxy.addr, "GET", &other, &[]).await;
    assert_eq!(&got.body[..], b"the GET result");
    assert_eq!(origin.count("GET", "/elsewhere"), 1);
    proxy.stop().await;
}
