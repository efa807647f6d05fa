//! Replaying a workload: turning an experiment's `[workload]` table into
//! requests, replaying per-node jobs with the client emulator, and merging what came back.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use hdrhistogram::Histogram;
use indicatif::ProgressBar;
use meshcache_workload::generate::WorkloadSpec;
use meshcache_workload::Request;

use crate::client::{self, Classifier, Outcome, Target};

use crate::experiment::Experiment;

/// The requests one node's clients replay.
#[derive(Clone, Debug)]
pub struct NodeJob {
    /// Where its clients connect (the node, or a link relay in front of it).
    pub target: std::net::SocketAddr,
    /// The node's name (as its `X-Cache` headers say).
    pub local: String,
    /// The names of its parents.
    pub parents: Vec<String>,
    /// One stream per emulated client.
    pub streams: Vec<Vec<Request>>,
}

/// What one job's replay measured.
#[derive(Clone, Debug)]
pub struct JobOutcome {
    /// Completed requests.
    pub requests: u64,
    /// Failed requests.
    pub errors: u64,
    /// Answered from the node's own cache.
    pub local_hits: u64,
    /// Answered from a sibling's cache.
    pub sibling_hits: u64,
    /// Answered from a parent's cache.
    pub parent_hits: u64,
    /// Body bytes received.
    pub bytes: u64,
    /// Body bytes of hits (local, sibling or parent).
    pub hit_bytes: u64,
    /// Latency in microseconds.
    pub latency: Histogram<u64>,
}

/// Turns an experiment's `[workload]` table into requests: a generator spec of
/// meshcache-workload, or `trace = "FILE"` (relative to `base`) to replay a trace.
pub fn generate(
    spec: &toml::Table,
    seed: u64,
    base: &std::path::Path,
) -> anyhow::Result<Vec<Request>> {
    if let Some(trace) = spec.get("trace") {
        if spec.len() > 1 {
            anyhow::bail!("workload: a trace takes no other keys");
        }
        let path = base.join(
            trace
                .as_str()
                .context("workload.trace must be a file name")?,
        );
        let file = std::fs::File::open(&path)
            .with_context(|| format!("workload.trace: cannot open {}", path.display()))?;
        let (_, requests) = meshcache_workload::trace::read(std::io::BufReader::new(file))
            .with_context(|| format!("workload.trace: {}", path.display()))?;
        return Ok(requests);
    }
    let spec: WorkloadSpec = spec
        .clone()
        .try_into()
        .context("workload: not a valid generator spec")?;
    meshcache_workload::generate::generate(&spec, seed).context("workload")
}

/// Replays every job at once (each node's clients against it); returns one outcome per job.
pub async fn replay(
    jobs: &[NodeJob],
    exp: &Experiment,
    bar: Option<&ProgressBar>,
) -> Vec<JobOutcome> {
    let progress = Arc::new(AtomicU64::new(0));
    let runs = jobs.iter().map(|j| {
        let job = client::Job {
            target: Target::Proxy(j.target),
            streams: j.streams.clone(),
            outstanding: exp.clients.outstanding,
            think: exp.clients.think,
            timeout: exp.clients.timeout,
            deadline: Some(exp.clients.deadline),
            classifier: Classifier {
                local: j.local.clone(),
                parents: j.parents.clone(),
            },
        };
        let progress = Arc::clone(&progress);
        async move { client::run(&job, Some(progress)).await }
    });
    let all = futures_join_all(runs);
    tokio::pin!(all);
    let reports = loop {
        tokio::select! {
            r = &mut all => break r,
            () = tokio::time::sleep(Duration::from_millis(200)) => {
                if let Some(b) = bar {
                    b.set_position(progress.load(Ordering::Relaxed));
                }
            }
        }
    };
    reports
        .into_iter()
        .map(|r| {
            let hits = [Outcome::LocalHit, Outcome::SiblingHit, Outcome::ParentHit];
            JobOutcome {
                requests: r.requests,
                errors: r.errors.total(),
                local_hits: r.count(Outcome::LocalHit),
                sibling_hits: r.count(Outcome::SiblingHit),
                parent_hits: r.count(Outcome::ParentHit),
                bytes: r.bytes,
                hit_bytes: hits.iter().map(|o| r.bytes_of(*o)).sum(),
                latency: r.latency,
            }
        })
        .collect()
}

/// Replays `order` (requests in trace order, each with the index of its job in `jobs`) one
/// at a time: each request is sent when the one before has been answered, after
/// `serial_gap`; one more gap follows the last. Returns one outcome per job, as [`replay`]
/// does.
pub async fn serial(
    jobs: &[NodeJob],
    order: &[(usize, Request)],
    exp: &Experiment,
    bar: Option<&ProgressBar>,
) -> Vec<JobOutcome> {
    let mut outcomes: Vec<JobOutcome> = jobs.iter().map(|_| merge(&[])).collect();
    for (done, (j, request)) in order.iter().enumerate() {
        if let Some(gap) = exp.clients.serial_gap {
            tokio::time::sleep(gap).await;
        }
        let one = NodeJob {
            streams: vec![vec![request.clone()]],
            ..jobs[*j].clone()
        };
        let outcome = replay(std::slice::from_ref(&one), exp, None).await;
        outcomes[*j] = merge(&[
            std::mem::replace(&mut outcomes[*j], merge(&[])),
            merge(&outcome),
        ]);
        if let Some(b) = bar {
            b.set_position(done as u64 + 1);
        }
    }
    // The upkeep the last request caused (a directory update, a summary delta) runs in one
    // more gap, as it does between any two requests, and is measured with them.
    if let (Some(gap), false) = (exp.clients.serial_gap, order.is_empty()) {
        tokio::time::sleep(gap).await;
    }
    outcomes
}

/// Awaits all futures concurrently (in this task), keeping their order.
async fn futures_join_all<F: std::future::Future>(
    futures: impl IntoIterator<Item = F>,
) -> Vec<F::Output> {
    let mut set = Vec::new();
    for f in futures {
        set.push(Box::pin(f));
    }
    let mut out: Vec<Option<F::Output>> = set.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, f) in set.iter_mut().enumerate() {
            if out[i].is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => out[i] = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter().flatten().collect()
}

/// Sums the jobs' figures (histograms merged).
pub fn merge(outcomes: &[JobOutcome]) -> JobOutcome {
    let mut m = JobOutcome {
        requests: 0,
        errors: 0,
        local_hits: 0,
        sibling_hits: 0,
        parent_hits: 0,
        bytes: 0,
        hit_bytes: 0,
        latency: client::histogram(),
    };
    for o in outcomes {
        m.requests += o.requests;
        m.errors += o.errors;
        m.local_hits += o.local_hits;
        m.sibling_hits += o.sibling_hits;
        m.parent_hits += o.parent_hits;
        m.bytes += o.bytes;
        m.hit_bytes += o.hit_bytes;
        let _ = m.latency.add(&o.latency);
    }
    m
}
