//! Counters and the latency histogram, rendered as Prometheus text (`/metrics`) and JSON
//! (`/stats`). Counters are relaxed atomics; the histogram (microseconds, 3 significant
//! digits) sits behind a short lock.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use hdrhistogram::Histogram;
use parking_lot::Mutex;
use serde::Serialize;

use crate::outcome::ResultCode;

/// Upper bounds of the exported latency buckets, in milliseconds.
const LATENCY_BUCKETS_MS: [f64; 14] = [
    0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 10000.0,
];

/// Every counter the proxy keeps.
pub struct Metrics {
    requests: [AtomicU64; ResultCode::ALL.len()],
    /// Bytes sent to clients (heads and bodies).
    pub bytes_to_clients: AtomicU64,
    /// Body bytes received from upstreams.
    pub bytes_from_upstream: AtomicU64,
    /// Client connections accepted.
    pub client_connections: AtomicU64,
    /// Client connections refused by the ACL at accept.
    pub client_denied: AtomicU64,
    /// Requests the HTTP parser refused (malformed, too large).
    pub invalid_requests: AtomicU64,
    /// New TCP connections made to upstreams.
    pub upstream_connections_opened: AtomicU64,
    /// Upstream requests sent over a pooled (reused) connection.
    pub upstream_connections_reused: AtomicU64,
    /// Upstream requests that failed (connect, timeout, reset).
    pub upstream_errors: AtomicU64,
    /// Transactions that ended before their response was sent whole: the client went away, or
    /// the upstream body broke off (logged with Squid's `_ABORTED` suffix).
    pub aborted: AtomicU64,
    /// Requests that waited for another request's fetch of the same URL.
    pub collapsed: AtomicU64,
    /// Responses naming an applet (`CacheApplet`) not stored because applets are disabled.
    pub applets_not_stored: AtomicU64,
    /// Time by kind of work, and requests by sender.
    pub efficiency: crate::efficiency::Efficiency,
    /// Each side's socket options as the kernel reports them.
    pub sockets: crate::sockopt::SocketsSeen,
    latency_us: Mutex<Histogram<u64>>,
}

/// Store figures, read at render time.
#[derive(Clone, Debug, Default, Serialize)]
pub struct StoreStats {
    /// Objects held in memory.
    pub objects: u64,
    /// Bytes held in memory.
    pub bytes: u64,
    /// The memory's byte budget.
    pub capacity: u64,
    /// Objects admitted since start.
    pub admitted: u64,
    /// Objects evicted by replacement since start.
    pub evicted: u64,
    /// Objects invalidated since start.
    pub invalidated: u64,
    /// The shared-memory arena of large bodies sent with sendfile(2), when there is one.
    pub arena: Option<crate::zerocopy::ArenaStats>,
    /// Large disk objects kept open and mapped between hits.
    pub open_files: u64,
    /// Body bytes sent to clients with sendfile(2) from the disks' files.
    pub disk_sendfile_bytes: u64,
    /// Each disk, in configuration order.
    pub disks: Vec<crate::cache::DiskReport>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Fresh counters.
    pub fn new() -> Self {
        Metrics {
            requests: std::array::from_fn(|_| AtomicU64::new(0)),
            bytes_to_clients: AtomicU64::new(0),
            bytes_from_upstream: AtomicU64::new(0),
            client_connections: AtomicU64::new(0),
            client_denied: AtomicU64::new(0),
            invalid_requests: AtomicU64::new(0),
            upstream_connections_opened: AtomicU64::new(0),
            upstream_connections_reused: AtomicU64::new(0),
            upstream_errors: AtomicU64::new(0),
            aborted: AtomicU64::new(0),
            collapsed: AtomicU64::new(0),
            applets_not_stored: AtomicU64::new(0),
            efficiency: crate::efficiency::Efficiency::default(),
            sockets: crate::sockopt::SocketsSeen::default(),
            latency_us: Mutex::new(
                Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds"),
            ),
        }
    }

    /// Counts one finished transaction.
    pub fn record(&self, code: ResultCode, bytes: u64, elapsed: Duration) {
        self.requests[code.index()].fetch_add(1, Relaxed);
        self.bytes_to_clients.fetch_add(bytes, Relaxed);
        let us = u64::try_from(elapsed.as_micros())
            .unwrap_or(u64::MAX)
            .max(1);
        self.latency_us.lock().saturating_record(us);
    }

    /// Requests that ended with `code`.
    pub fn requests(&self, code: ResultCode) -> u64 {
        self.requests[code.index()].load(Relaxed)
    }

    /// A consistent-enough copy of every figure.
    pub fn snapshot(&self, store: StoreStats) -> Snapshot {
        let by_code = ResultCode::ALL
            .iter()
            .map(|c| (c.as_str(), self.requests(*c)))
            .collect::<Vec<_>>();
        let total = by_code.iter().map(|(_, n)| n).sum();
        let hits = ResultCode::ALL
            .iter()
            .filter(|c| c.is_hit())
            .map(|c| self.requests(*c))
            .sum();
        let h = self.latency_us.lock();
        let q = |p: f64| {
            if h.is_empty() {
                0.0
            } else {
                h.value_at_quantile(p) as f64 / 1000.0
            }
        };
        Snapshot {
            requests: total,
            hits,
            requests_by_result: by_code
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect(),
            bytes_to_clients: self.bytes_to_clients.load(Relaxed),
            bytes_from_upstream: self.bytes_from_upstream.load(Relaxed),
            client_connections: self.client_connections.load(Relaxed),
            client_denied: self.client_denied.load(Relaxed),
            invalid_requests: self.invalid_requests.load(Relaxed),
            upstream_connections_opened: self.upstream_connections_opened.load(Relaxed),
            upstream_connections_reused: self.upstream_connections_reused.load(Relaxed),
            upstream_errors: self.upstream_errors.load(Relaxed),
            aborted: self.aborted.load(Relaxed),
            collapsed: self.collapsed.load(Relaxed),
            applets_not_stored: self.applets_not_stored.load(Relaxed),
            latency_ms: LatencySummary {
                count: h.len(),
                mean: if h.is_empty() { 0.0 } else { h.mean() / 1000.0 },
                p50: q(0.5),
                p90: q(0.9),
                p99: q(0.99),
                max: h.max() as f64 / 1000.0,
            },
            store,
            sockets: self.sockets.report(),
        }
    }

    /// Prometheus text exposition.
    pub fn prometheus(&self, store: StoreStats) -> String {
        let s = self.snapshot(store);
        let mut out = String::with_capacity(4096);
        let mut counter = |name: &str, help: &str, value: u64| {
            let _ = writeln!(out, "# HELP meshcache_{name} {help}\n# TYPE meshcache_{name} counter\nmeshcache_{name} {value}");
        };
        counter(
            "bytes_to_clients_total",
            "Bytes sent to clients.",
            s.bytes_to_clients,
        );
        counter(
            "bytes_from_upstream_total",
            "Body bytes received from upstreams.",
            s.bytes_from_upstream,
        );
        counter(
            "client_connections_total",
            "Client connections accepted.",
            s.client_connections,
        );
        counter(
            "client_denied_total",
            "Client connections refused by the ACL.",
            s.client_denied,
        );
        counter(
            "invalid_requests_total",
            "Requests the parser refused.",
            s.invalid_requests,
        );
        counter(
            "upstream_connections_opened_total",
            "TCP connections opened to upstreams.",
            s.upstream_connections_opened,
        );
        counter(
            "upstream_connections_reused_total",
            "Upstream requests sent on a reused connection.",
            s.upstream_connections_reused,
        );
        counter(
            "upstream_errors_total",
            "Upstream requests that failed.",
            s.upstream_errors,
        );
        counter(
            "aborted_total",
            "Transactions whose response was not sent whole (client gone, upstream broke off).",
            s.aborted,
        );
        counter(
            "collapsed_total",
            "Requests served by another request's fetch.",
            s.collapsed,
        );
        counter(
            "applets_not_stored_total",
            "Responses naming an applet not stored because applets are disabled.",
            s.applets_not_stored,
        );
        counter(
            "store_admitted_total",
            "Objects admitted to the store.",
            s.store.admitted,
        );
        counter(
            "store_evicted_total",
            "Objects evicted by replacement.",
            s.store.evicted,
        );
        counter(
            "store_invalidated_total",
            "Objects invalidated.",
            s.store.invalidated,
        );
        counter(
            "disk_zero_copy_bytes_total",
            "Body bytes sent to clients with sendfile(2) from the disks' files.",
            s.store.disk_sendfile_bytes,
        );
        if let Some(a) = &s.store.arena {
            counter(
                "zero_copy_bytes_total",
                "Body bytes sent to clients with sendfile(2) from the body arena.",
                a.sent_bytes,
            );
            counter(
                "zero_copy_fallbacks_total",
                "Large bodies kept on the heap because the body arena had no room.",
                a.fallbacks,
            );
        }
        let _ = writeln!(out, "# HELP meshcache_requests_total Requests by Squid result code.\n# TYPE meshcache_requests_total counter");
        for (code, n) in &s.requests_by_result {
            let _ = writeln!(out, "meshcache_requests_total{{result=\"{code}\"}} {n}");
        }
        for (name, help, v) in [
            ("store_objects", "Objects in the store.", s.store.objects),
            ("store_bytes", "Bytes in the store.", s.store.bytes),
            (
                "store_capacity_bytes",
                "The store's byte budget.",
                s.store.capacity,
            ),
            (
                "store_arena_bytes",
                "Bytes of large bodies held in the body arena (whole pages).",
                s.store.arena.map_or(0, |a| a.held_bytes),
            ),
            (
                "store_open_files",
                "Large disk objects kept open and mapped between hits.",
                s.store.open_files,
            ),
        ] {
            let _ = writeln!(out, "# HELP meshcache_{name} {help}\n# TYPE meshcache_{name} gauge\nmeshcache_{name} {v}");
        }
        disk_metrics(&mut out, &s.store.disks);
        // A Prometheus histogram (cumulative buckets) read off the HDR histogram.
        let _ = writeln!(
            out,
            "# HELP meshcache_request_duration_seconds Time to serve a request.\n# TYPE meshcache_request_duration_seconds histogram"
        );
        let h = self.latency_us.lock();
        for bound_ms in LATENCY_BUCKETS_MS {
            let bound_us = (bound_ms * 1000.0) as u64;
            let n = h.count_between(0, bound_us);
            let _ = writeln!(
                out,
                "meshcache_request_duration_seconds_bucket{{le=\"{}\"}} {n}",
                bound_ms / 1000.0
            );
        }
        let _ = writeln!(
            out,
            "meshcache_request_duration_seconds_bucket{{le=\"+Inf\"}} {}\nmeshcache_request_duration_seconds_sum {}\nmeshcache_request_duration_seconds_count {}",
            h.len(),
            h.mean() * h.len() as f64 / 1e6,
            h.len()
        );
        out
    }
}

/// Latency figures in milliseconds.
#[derive(Clone, Debug, Serialize)]
pub struct LatencySummary {
    /// Requests measured.
    pub count: u64,
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Maximum.
    pub max: f64,
}

/// Everything `/stats` shows.
#[derive(Clone, Debug, Serialize)]
pub struct Snapshot {
    /// Requests finished.
    pub requests: u64,
    /// Requests whose body came from the store.
    pub hits: u64,
    /// Requests by Squid result code.
    pub requests_by_result: std::collections::BTreeMap<String, u64>,
    /// Bytes sent to clients.
    pub bytes_to_clients: u64,
    /// Body bytes from upstreams.
    pub bytes_from_upstream: u64,
    /// Client connections accepted.
    pub client_connections: u64,
    /// Client connections refused by the ACL.
    pub client_denied: u64,
    /// Requests the parser refused.
    pub invalid_requests: u64,
    /// Upstream connections opened.
    pub upstream_connections_opened: u64,
    /// Upstream requests on reused connections.
    pub upstream_connections_reused: u64,
    /// Failed upstream requests.
    pub upstream_errors: u64,
    /// Transactions whose response was not sent whole.
    pub aborted: u64,
    /// Collapsed requests.
    pub collapsed: u64,
    /// Responses naming an applet not stored because applets are disabled.
    pub applets_not_stored: u64,
    /// Latency summary.
    pub latency_ms: LatencySummary,
    /// Store figures.
    pub store: StoreStats,
    /// The latest connection's socket options on each side, read back from the kernel.
    pub sockets: crate::sockopt::SocketsReport,
}

/// Each disk's figures, labelled with its number and path.
fn disk_metrics(out: &mut String, disks: &[crate::cache::DiskReport]) {
    if disks.is_empty() {
        return;
    }
    type Read = fn(&crate::cache::DiskReport) -> u64;
    let series: [(&str, &str, &str, Read); 13] = [
        ("disk_objects", "gauge", "Objects on the disk.", |d| {
            d.objects
        }),
        (
            "disk_bytes",
            "gauge",
            "Bytes charged to the disk's budget.",
            |d| d.bytes,
        ),
        ("disk_capacity_bytes", "gauge", "The disk's budget.", |d| {
            d.capacity
        }),
        (
            "disk_write_queue_jobs",
            "gauge",
            "Jobs waiting for the disk's writer.",
            |d| d.stats.queue_jobs,
        ),
        (
            "disk_write_queue_bytes",
            "gauge",
            "Bytes those jobs hold.",
            |d| d.stats.queue_bytes,
        ),
        (
            "disk_rebuilding",
            "gauge",
            "1 while the disk's rebuild runs.",
            |d| u64::from(d.stats.rebuilding),
        ),
        (
            "disk_hits_total",
            "counter",
            "Hits served from the disk.",
            |d| d.stats.hits,
        ),
        (
            "disk_writes_total",
            "counter",
            "Records written to the disk.",
            |d| d.stats.writes,
        ),
        (
            "disk_written_bytes_total",
            "counter",
            "Bytes written to the disk.",
            |d| d.stats.written_bytes,
        ),
        (
            "disk_dropped_writes_total",
            "counter",
            "Writes dropped (queue full, or paused after a fault).",
            |d| d.stats.dropped,
        ),
        (
            "disk_removed_total",
            "counter",
            "Records removed from the disk.",
            |d| d.stats.removed,
        ),
        ("disk_syncs_total", "counter", "Syncs of the disk.", |d| {
            d.stats.syncs
        }),
        (
            "disk_rebuild_found_total",
            "counter",
            "Objects the disk's rebuild found.",
            |d| d.stats.rebuild_found,
        ),
    ];
    for (name, kind, help, read) in series {
        let _ = writeln!(
            out,
            "# HELP meshcache_{name} {help}\n# TYPE meshcache_{name} {kind}"
        );
        for (i, d) in disks.iter().enumerate() {
            let _ = writeln!(
                out,
                "meshcache_{name}{{disk=\"{i}\",path=\"{}\"}} {}",
                d.stats.path.replace('"', "'"),
                read(d)
            );
        }
    }
    let _ = writeln!(out, "# HELP meshcache_disk_faults_total Disk faults by kind.\n# TYPE meshcache_disk_faults_total counter");
    for (i, d) in disks.iter().enumerate() {
        let f = &d.stats.faults;
        for (kind, n) in [
            ("no_space", f.no_space),
            ("read_only", f.read_only),
            ("removed", f.removed),
            ("io", f.io),
            ("damaged", f.damaged),
        ] {
            let _ = writeln!(
                out,
                "meshcache_disk_faults_total{{disk=\"{i}\",kind=\"{kind}\"}} {n}"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_renders() {
        let m = Metrics::new();
        m.record(ResultCode::TcpMemHit, 100, Duration::from_millis(2));
        m.record(ResultCode::TcpMiss, 50, Duration::from_millis(20));
        let s = m.snapshot(StoreStats::default());
        assert_eq!((s.requests, s.hits, s.bytes_to_clients), (2, 1, 150));
        assert!(
            s.latency_ms.p99 >= 19.0 && s.latency_ms.p99 <= 21.0,
            "{:?}",
            s.latency_ms
        );
        let text = m.prometheus(StoreStats::default());
        assert!(text.contains("meshcache_requests_total{result=\"TCP_MEM_HIT\"} 1"));
        assert!(text.contains("meshcache_request_duration_seconds_count 2"));
        assert!(
            text.contains("meshcache_request_duration_seconds_bucket{le=\"0.005\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("meshcache_request_duration_seconds_bucket{le=\"0.025\"} 2"),
            "{text}"
        );
    }
}
