//! The admin listener: `/metrics` (Prometheus text) and `/stats` (JSON). Loopback by default;
//! it answers GET only and reveals no cached content.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;

use std::sync::atomic::Ordering::Relaxed;

use crate::Shared;

/// Answers one admin request.
pub(crate) async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let reply = |status: StatusCode, ctype: &'static str, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static(ctype),
        );
        r
    };
    if req.method() != Method::GET {
        return Ok(reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "GET only\n".into(),
        ));
    }
    // Summary updates that have arrived are counted when the inbox is read, up to a second
    // later on an idle node: read it now, so that a snapshot counts as received what its
    // peers' snapshots count as sent (a lab measuring between two snapshots relies on it).
    if let Some(s) = shared.coop.summaries() {
        s.read_inbox(&shared.coop, std::time::Duration::ZERO);
    }
    let stats = shared.cache.stats();
    Ok(match req.uri().path() {
        "/metrics" => {
            let mut text = shared.metrics.prometheus(stats);
            cooperation_metrics(&shared, &mut text);
            summary_metrics(&shared, &mut text);
            efficiency_metrics(&shared, &mut text);
            applet_metrics(&shared, &mut text);
            reply(StatusCode::OK, "text/plain; version=0.0.4", text)
        }
        "/stats" => {
            let mut snap = serde_json::to_value(shared.metrics.snapshot(stats)).unwrap_or_default();
            if let Some(obj) = snap.as_object_mut() {
                obj.insert(
                    "peers".into(),
                    serde_json::to_value(shared.coop.peer_stats()).unwrap_or_default(),
                );
                obj.insert("icp".into(), icp_counters(&shared));
                if let Some(d) = shared.coop.directory() {
                    obj.insert("directory".into(), d.report(&shared.coop));
                }
                if let Some(m) = shared.coop.multicast() {
                    obj.insert("multicast".into(), m.report(&shared.coop));
                }
                if let Some(s) = shared.coop.summaries() {
                    let names: Vec<String> =
                        shared.config.peers.iter().map(|p| p.name.clone()).collect();
                    obj.insert("summary".into(), s.report(&names));
                }
                if let Some(a) = &shared.applets {
                    obj.insert("applets".into(), a.report());
                }
                obj.insert(
                    "efficiency".into(),
                    serde_json::to_value(shared.efficiency()).unwrap_or_default(),
                );
                let e = &shared.metrics.efficiency;
                obj.insert(
                    "requests_received".into(),
                    serde_json::json!({
                        "from_clients": e.from_clients.load(Relaxed),
                        "from_peers": e.from_peers.load(Relaxed),
                    }),
                );
            }
            let body = serde_json::to_string_pretty(&snap)
                .unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"));
            reply(StatusCode::OK, "application/json", body + "\n")
        }
        "/" => reply(
            StatusCode::OK,
            "text/plain",
            "meshcache admin: /metrics /stats\n".into(),
        ),
        _ => reply(
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found: try /metrics or /stats\n".into(),
        ),
    })
}

/// Active Cache lines of `/metrics`: every counter of the `/stats` "applets" object, and its
/// one gauge.
fn applet_metrics(shared: &Shared, out: &mut String) {
    use std::fmt::Write as _;
    let Some(a) = &shared.applets else {
        return;
    };
    if let Some(obj) = a.report().as_object() {
        for (k, v) in obj {
            let _ = if k == "ready_ahead" {
                writeln!(
                    out,
                    "# HELP meshcache_applet_{k} Instances made ahead, waiting for their hit.\n# TYPE meshcache_applet_{k} gauge\nmeshcache_applet_{k} {v}"
                )
            } else {
                writeln!(
                    out,
                    "# TYPE meshcache_applet_{k}_total counter\nmeshcache_applet_{k}_total {v}"
                )
            };
        }
    }
}

fn icp_counters(shared: &Shared) -> serde_json::Value {
    let c = &shared.coop.counters;
    let get = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    serde_json::json!({
        "queries_sent": get(&c.queries_sent),
        "replies_received": get(&c.replies_received),
        "queries_received": get(&c.queries_received),
        "replies_sent": get(&c.replies_sent),
        "denied": get(&c.denied),
        "dropped": get(&c.dropped),
        "bytes_sent": get(&c.bytes_sent),
        "bytes_received": get(&c.bytes_received),
        "directory_sent": get(&c.directory_sent),
        "directory_received": get(&c.directory_received),
        "directory_bad": get(&c.directory_bad),
    })
}

/// Per-peer and ICP lines of `/metrics`.
fn cooperation_metrics(shared: &Shared, out: &mut String) {
    use std::fmt::Write as _;
    if let Some(obj) = icp_counters(shared).as_object() {
        for (k, v) in obj {
            let _ = writeln!(
                out,
                "# TYPE meshcache_icp_{k}_total counter\nmeshcache_icp_{k}_total {v}"
            );
        }
    }
    if let Some(d) = shared.coop.directory() {
        if let Some(obj) = d.report(&shared.coop).as_object() {
            for (k, v) in obj {
                let kind = match k.as_str() {
                    "entries" | "entry_budget_bytes" | "members" | "in_flight"
                    | "queued_updates" => "gauge",
                    _ => "counter",
                };
                let name = if kind == "counter" {
                    format!("meshcache_directory_{k}_total")
                } else {
                    format!("meshcache_directory_{k}")
                };
                let _ = writeln!(out, "# TYPE {name} {kind}\n{name} {v}");
            }
        }
    }
    if let Some(m) = shared.coop.multicast() {
        if let Some(obj) = m.report(&shared.coop).as_object() {
            for (k, v) in obj {
                match k.as_str() {
                    "mode" => {
                        let _ = writeln!(
                            out,
                            "# HELP meshcache_multicast_mode How queries are sent: one datagram to the group (ip) or one per member (logical).\n# TYPE meshcache_multicast_mode gauge\nmeshcache_multicast_mode{{mode={v}}} 1"
                        );
                    }
                    "group" | "why_logical" => {}
                    "in_flight" | "wait_ms" => {
                        let _ = writeln!(
                            out,
                            "# TYPE meshcache_multicast_{k} gauge\nmeshcache_multicast_{k} {v}"
                        );
                    }
                    _ => {
                        let _ = writeln!(
                            out,
                            "# TYPE meshcache_multicast_{k}_total counter\nmeshcache_multicast_{k}_total {v}"
                        );
                    }
                }
            }
        }
    }
    let peers = shared.coop.peer_stats();
    if peers.is_empty() {
        return;
    }
    let _ = writeln!(out, "# HELP meshcache_peer_up Whether the peer's HTTP side may be used.\n# TYPE meshcache_peer_up gauge");
    for p in &peers {
        let _ = writeln!(
            out,
            "meshcache_peer_up{{peer=\"{}\",role=\"{}\"}} {}",
            p.name,
            p.role,
            u8::from(p.up)
        );
    }
    let _ = writeln!(out, "# TYPE meshcache_peer_icp_rtt_milliseconds gauge");
    for p in &peers {
        if let Some(rtt) = p.rtt_ms {
            let _ = writeln!(
                out,
                "meshcache_peer_icp_rtt_milliseconds{{peer=\"{}\"}} {rtt}",
                p.name
            );
        }
    }
    let _ = writeln!(out, "# HELP meshcache_peer_events_total ICP and fetch events per peer.\n# TYPE meshcache_peer_events_total counter");
    for p in &peers {
        let s = &p.stats;
        for (event, n) in [
            ("query", s.queries),
            ("hit", s.hits),
            ("miss", s.misses),
            ("miss_nofetch", s.miss_nofetch),
            ("denied", s.denied),
            ("err", s.errors),
            ("late", s.late),
            ("timeout", s.timeouts),
            ("fetch", s.fetches),
            ("fetch_failure", s.fetch_failures),
            ("query_received", s.queries_received),
        ] {
            let _ = writeln!(
                out,
                "meshcache_peer_events_total{{peer=\"{}\",event=\"{event}\"}} {n}",
                p.name
            );
        }
    }
}

/// Summary lines of `/metrics` (summary and digest protocols), from the `/stats` report.
fn summary_metrics(shared: &Shared, out: &mut String) {
    use std::fmt::Write as _;
    let Some(s) = shared.coop.summaries() else {
        return;
    };
    let names: Vec<String> = shared.config.peers.iter().map(|p| p.name.clone()).collect();
    let r = s.report(&names);
    let num = |v: &serde_json::Value| v.as_f64().unwrap_or(0.0);
    let local = &r["local"];
    for (name, help, v) in [
        ("entries", "Documents in our summary.", &local["entries"]),
        ("bits", "Size of our summary in bits.", &local["bits"]),
        ("fill", "Share of our summary's bits set.", &local["fill"]),
        (
            "counter_bytes",
            "Memory of our counting filter.",
            &local["counter_bytes"],
        ),
        (
            "peer_bytes",
            "Memory of the peers' summaries.",
            &r["peer_memory_bytes"],
        ),
    ] {
        let _ = writeln!(out, "# HELP meshcache_summary_{name} {help}\n# TYPE meshcache_summary_{name} gauge\nmeshcache_summary_{name} {}", num(v));
    }
    for (name, v) in [
        ("updates_sent", &r["updates_sent"]),
        ("update_bytes_sent", &r["update_bytes_sent"]),
        ("bad_updates", &r["bad_updates"]),
        ("served", &r["served"]),
        ("served_bytes", &r["served_bytes"]),
    ] {
        let _ = writeln!(
            out,
            "# TYPE meshcache_summary_{name}_total counter\nmeshcache_summary_{name}_total {}",
            num(v)
        );
    }
    let _ = writeln!(out, "# HELP meshcache_peer_summary_events_total Summary lookups, hits, false hits, fetches and updates per peer.\n# TYPE meshcache_peer_summary_events_total counter");
    let peers = r["peers"].as_array().cloned().unwrap_or_default();
    for p in &peers {
        let name = p["name"].as_str().unwrap_or("");
        for event in [
            "lookups",
            "summary_hits",
            "false_hits",
            "full_fetches",
            "full_bytes",
            "updates",
            "update_bytes",
            "gaps",
            "rejected_malformed",
            "rejected_too_full",
            "fetch_failures",
        ] {
            let _ = writeln!(
                out,
                "meshcache_peer_summary_events_total{{peer=\"{name}\",event=\"{event}\"}} {}",
                num(&p["stats"][event])
            );
        }
    }
    let _ = writeln!(out, "# HELP meshcache_peer_summary_fp_rate False-positive rate of a peer's summary: observed, the Bloom formula's, and fill^k.\n# TYPE meshcache_peer_summary_fp_rate gauge");
    for p in &peers {
        let name = p["name"].as_str().unwrap_or("");
        for kind in ["observed", "formula", "fill"] {
            let v = &p[format!("{kind}_fp_rate")];
            if !v.is_null() {
                let _ = writeln!(
                    out,
                    "meshcache_peer_summary_fp_rate{{peer=\"{name}\",kind=\"{kind}\"}} {}",
                    num(v)
                );
            }
        }
    }
}

/// Time by kind of work, process CPU time and requests by sender, for `/metrics`.
fn efficiency_metrics(shared: &Shared, out: &mut String) {
    use std::fmt::Write as _;
    let r = shared.efficiency();
    let _ = writeln!(out, "# HELP meshcache_work_seconds_total Time spent serving clients, serving peers, and searching peers.\n# TYPE meshcache_work_seconds_total counter");
    for (category, s) in [
        ("client", r.client_s),
        ("peer", r.peer_s),
        ("search", r.search_s),
    ] {
        let _ = writeln!(
            out,
            "meshcache_work_seconds_total{{category=\"{category}\"}} {s}"
        );
    }
    if let (Some(cpu), Some(overhead)) = (r.cpu_s, r.overhead_s) {
        let _ = writeln!(out, "# HELP meshcache_process_cpu_seconds_total CPU time of the process (user and system).\n# TYPE meshcache_process_cpu_seconds_total counter\nmeshcache_process_cpu_seconds_total {cpu}");
        let _ = writeln!(out, "# HELP meshcache_overhead_seconds CPU time not spent on clients, peers or searches.\n# TYPE meshcache_overhead_seconds gauge\nmeshcache_overhead_seconds {overhead}");
    }
    let e = &shared.metrics.efficiency;
    let _ = writeln!(out, "# HELP meshcache_requests_received_total HTTP requests received, by sender.\n# TYPE meshcache_requests_received_total counter");
    for (from, n) in [("client", &e.from_clients), ("peer", &e.from_peers)] {
        let _ = writeln!(
            out,
            "meshcache_requests_received_total{{from=\"{from}\"}} {}",
            n.load(Relaxed)
        );
    }
}
