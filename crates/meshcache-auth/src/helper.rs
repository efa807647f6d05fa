//! A pool of Squid helper processes: start, dispatch, answer, restart.
//!
//! The pool runs `children` copies of one helper program (`basic_ncsa_auth`, `basic_ldap_auth`,
//! `ext_unix_group_acl`, …), each owned by a *slot* task that writes request lines to the
//! child's stdin and reads its replies ([`crate::protocol`]). The child's stderr goes to the log
//! line by line, as Squid copies it to `cache.log`.
//!
//! **Dispatch.** A request goes to the least busy running slot (fewest requests queued or in
//! flight; ties taken in turn). A slot sends as many at once as the helper has channels —
//! `concurrency`, or one without it — and keeps the rest in order.
//!
//! **Failures.** The requester, not the slot, decides what happens next:
//!
//! * the child dies (killed, crashed) or closes its stdout: its in-flight requests come back as
//!   died and are sent again to another child, its queued ones as never sent and are simply
//!   dispatched again — so killing a helper costs no request;
//! * `BH` (or a line that is not the protocol): sent again to another child;
//! * no answer within `helper_timeout`: the slot kills the child, the request is retried once
//!   more, and a second timeout ends it.
//!
//! A request makes at most [`MAX_ATTEMPTS`] attempts; a request that is never sent does not use
//! one up. An overall deadline ([`MAX_ATTEMPTS`] + 1 timeouts) bounds the whole, queueing
//! included, so a check never hangs.
//!
//! **Restarts.** A slot whose child ended starts a new one. A child that died without answering
//! anything is restarted after a backoff that doubles from 100 ms to 10 s (a helper that cannot
//! start, or crashes on every request, would otherwise be respawned in a tight loop); one that
//! answered, or ran for a minute, is restarted at once. While no slot has a running child a
//! request waits up to `helper_timeout` for one.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::error::{AuthError, HelperFailure};
use crate::protocol::{parse_reply, BadReply, Reply, ResultCode};
use crate::stats::Counters;

/// Attempts per request (the first send and the retries).
pub(crate) const MAX_ATTEMPTS: u32 = 3;
/// Timeouts per request before it is given up.
const MAX_TIMEOUTS: u32 = 2;
/// Re-dispatches of never-sent requests per request (a guard; each waits for a live slot).
const MAX_REDISPATCH: u32 = 32;
/// The longest reply line read from a helper; a longer one is a protocol error.
const MAX_REPLY_LINE: usize = 64 * 1024;
/// stderr lines are logged in pieces of at most this many bytes.
const MAX_STDERR_LINE: usize = 4096;
/// A child that ran this long is healthy, whatever happened to it then.
const HEALTHY_AFTER: Duration = Duration::from_secs(60);
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(10);
/// How long the replies a dead child left in its pipe are read for.
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(100);

/// What the pool is given.
#[derive(Clone, Debug)]
pub(crate) struct PoolConfig {
    /// `auth` or `group`, for logs and errors.
    pub(crate) name: &'static str,
    /// The helper's command line.
    pub(crate) argv: Vec<String>,
    /// How many children.
    pub(crate) children: usize,
    /// Channels per child; 0 is the non-concurrent protocol.
    pub(crate) concurrency: usize,
    /// How long one request may go unanswered.
    pub(crate) timeout: Duration,
}

/// A running pool.
pub(crate) struct Pool {
    name: &'static str,
    slots: Vec<SlotHandle>,
    live: watch::Receiver<u64>,
    timeout: Duration,
    turn: AtomicUsize,
    counters: Arc<Counters>,
    tasks: Vec<JoinHandle<()>>,
}

struct SlotHandle {
    shared: Arc<SlotShared>,
    jobs: mpsc::UnboundedSender<Job>,
}

/// What a slot shows the dispatcher.
struct SlotShared {
    index: usize,
    /// A child is running and taking requests.
    live: AtomicBool,
    /// Requests given to this slot and not yet finished.
    load: AtomicUsize,
    /// The running child's pid (0: none).
    pid: AtomicU32,
}

/// One request handed to a slot.
struct Job {
    /// The request line without channel-ID and line end.
    line: Arc<str>,
    reply: oneshot::Sender<Result<Reply, Failure>>,
    _load: LoadGuard,
}

/// Counts a job in its slot's load for as long as the job exists.
struct LoadGuard(Arc<SlotShared>);

impl Drop for LoadGuard {
    fn drop(&mut self) {
        self.0.load.fetch_sub(1, Ordering::Relaxed);
    }
}

/// How a slot gives a request back unanswered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Failure {
    /// Never written to the child: dispatch it again.
    NotSent,
    /// Written; the child died before answering.
    Died,
    /// Written; unanswered within the timeout (the child was killed).
    TimedOut,
}

/// What a slot task shares with its siblings.
struct SlotContext {
    config: PoolConfig,
    counters: Arc<Counters>,
    live: watch::Sender<u64>,
}

impl Pool {
    /// Starts every child. Fails if the program cannot be started at all (not found, not
    /// executable); a child that starts and then dies is the slot's business.
    pub(crate) fn start(config: PoolConfig, counters: Arc<Counters>) -> Result<Pool, AuthError> {
        let (live_tx, live_rx) = watch::channel(0u64);
        let context = Arc::new(SlotContext {
            config: config.clone(),
            counters: counters.clone(),
            live: live_tx,
        });
        let mut slots = Vec::with_capacity(config.children);
        let mut tasks = Vec::with_capacity(config.children);
        for index in 0..config.children {
            let child = spawn(&config.argv).map_err(|source| AuthError::Spawn {
                program: config.argv.first().cloned().unwrap_or_default(),
                source,
            })?;
            let shared = Arc::new(SlotShared {
                index,
                live: AtomicBool::new(false),
                load: AtomicUsize::new(0),
                pid: AtomicU32::new(0),
            });
            let (jobs_tx, jobs_rx) = mpsc::unbounded_channel();
            tasks.push(tokio::spawn(run_slot(
                context.clone(),
                shared.clone(),
                child,
                jobs_rx,
            )));
            slots.push(SlotHandle {
                shared,
                jobs: jobs_tx,
            });
        }
        Ok(Pool {
            name: config.name,
            slots,
            live: live_rx,
            timeout: config.timeout,
            turn: AtomicUsize::new(0),
            counters,
            tasks,
        })
    }

    /// Sends one request (its line without channel-ID) and returns the helper's `OK` or `ERR`
    /// reply, retrying as the module docs say.
    pub(crate) async fn request(&self, line: &str) -> Result<Reply, HelperFailure> {
        let deadline = self.timeout.saturating_mul(MAX_ATTEMPTS + 1);
        match tokio::time::timeout(deadline, self.attempts(line)).await {
            Ok(result) => result,
            Err(_) => Err(HelperFailure::Deadline),
        }
    }

    async fn attempts(&self, line: &str) -> Result<Reply, HelperFailure> {
        let line: Arc<str> = Arc::from(line);
        let (mut attempts, mut timeouts, mut redispatches) = (0, 0, 0);
        let mut avoid = None;
        loop {
            let slot = self.pick(avoid).await?;
            let (reply_tx, reply_rx) = oneshot::channel();
            slot.shared.load.fetch_add(1, Ordering::Relaxed);
            let job = Job {
                line: line.clone(),
                reply: reply_tx,
                _load: LoadGuard(slot.shared.clone()),
            };
            if slot.jobs.send(job).is_err() {
                return Err(HelperFailure::ShuttingDown);
            }
            let failure = match reply_rx.await {
                Ok(Ok(reply)) => match reply.result {
                    ResultCode::Ok | ResultCode::Err => return Ok(reply),
                    ResultCode::BrokenHelper | ResultCode::Unknown => {
                        tracing::warn!(
                            helper = self.name,
                            slot = slot.shared.index,
                            message = reply.message().unwrap_or(""),
                            "helper answered BH (or garbage); asking another"
                        );
                        HelperFailure::Broken
                    }
                },
                Ok(Err(Failure::NotSent)) => {
                    redispatches += 1;
                    if redispatches > MAX_REDISPATCH {
                        return Err(HelperFailure::Died);
                    }
                    avoid = Some(slot.shared.index);
                    continue;
                }
                Ok(Err(Failure::Died)) | Err(_) => HelperFailure::Died,
                Ok(Err(Failure::TimedOut)) => {
                    timeouts += 1;
                    HelperFailure::TimedOut
                }
            };
            attempts += 1;
            if failure != HelperFailure::TimedOut {
                self.counters.helper_errors.fetch_add(1, Ordering::Relaxed);
            }
            if attempts >= MAX_ATTEMPTS || timeouts >= MAX_TIMEOUTS {
                return Err(failure);
            }
            avoid = Some(slot.shared.index);
        }
    }

    /// The least busy slot with a running child, waiting up to the timeout for one. `avoid` is
    /// taken only when no other slot runs.
    async fn pick(&self, avoid: Option<usize>) -> Result<&SlotHandle, HelperFailure> {
        let deadline = Instant::now() + self.timeout;
        let mut live = self.live.clone();
        loop {
            live.borrow_and_update();
            if let Some(slot) = self.least_busy(avoid) {
                return Ok(slot);
            }
            match tokio::time::timeout_at(deadline, live.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Err(HelperFailure::ShuttingDown),
                Err(_) => return Err(HelperFailure::NoneRunning),
            }
        }
    }

    fn least_busy(&self, avoid: Option<usize>) -> Option<&SlotHandle> {
        let n = self.slots.len();
        let start = self.turn.fetch_add(1, Ordering::Relaxed);
        let mut best: Option<(usize, &SlotHandle)> = None;
        for k in 0..n {
            let slot = &self.slots[(start + k) % n];
            if !slot.shared.live.load(Ordering::Acquire) {
                continue;
            }
            let mut load = slot.shared.load.load(Ordering::Relaxed);
            if Some(slot.shared.index) == avoid {
                load = load.saturating_add(usize::MAX / 2);
            }
            if best.is_none_or(|(least, _)| load < least) {
                best = Some((load, slot));
            }
        }
        best.map(|(_, slot)| slot)
    }

    /// The running children's pids, by slot (0: none running in that slot).
    pub(crate) fn pids(&self) -> Vec<u32> {
        self.slots
            .iter()
            .map(|s| s.shared.pid.load(Ordering::Acquire))
            .collect()
    }

    /// Stops taking requests, kills the children and waits (briefly) for the slot tasks.
    pub(crate) async fn shutdown(self) {
        let Pool { slots, tasks, .. } = self;
        drop(slots);
        for task in tasks {
            let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        }
    }
}

fn spawn(argv: &[String]) -> std::io::Result<Child> {
    let Some((program, args)) = argv.split_first() else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "empty command line",
        ));
    };
    Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
}

/// How a child's session ended.
enum End {
    /// The pool is gone.
    Shutdown,
    /// The child exited (or closed its stdout).
    Exited(Option<std::process::ExitStatus>),
    /// A request went unanswered past the timeout.
    TimedOut,
    /// The child broke the protocol or a pipe failed.
    Broken(String),
}

impl std::fmt::Display for End {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            End::Shutdown => f.write_str("shut down"),
            End::Exited(Some(status)) => write!(f, "exited ({status})"),
            End::Exited(None) => f.write_str("closed its output"),
            End::TimedOut => f.write_str("timed out"),
            End::Broken(why) => write!(f, "broken: {why}"),
        }
    }
}

/// One slot: runs a child until it ends, restarts it, forever (until the pool is dropped).
async fn run_slot(
    context: Arc<SlotContext>,
    shared: Arc<SlotShared>,
    first: Child,
    mut jobs: mpsc::UnboundedReceiver<Job>,
) {
    let name = context.config.name;
    let mut next = Some(first);
    let mut quick_deaths: u32 = 0;
    loop {
        let child = match next.take() {
            Some(child) => child,
            None => match spawn(&context.config.argv) {
                Ok(child) => child,
                Err(error) => {
                    quick_deaths = quick_deaths.saturating_add(1);
                    let delay = backoff(quick_deaths);
                    tracing::error!(helper = name, slot = shared.index, %error, retry_in = ?delay, "cannot start helper");
                    if !wait_refusing(&mut jobs, delay).await {
                        return;
                    }
                    continue;
                }
            },
        };
        let started = Instant::now();
        let (end, answered) = session(&context, &shared, child, &mut jobs).await;
        let lived = started.elapsed();
        if matches!(end, End::Shutdown) {
            return;
        }
        context
            .counters
            .helper_restarts
            .fetch_add(1, Ordering::Relaxed);
        if answered > 0 || lived >= HEALTHY_AFTER {
            quick_deaths = 0;
        } else {
            quick_deaths = quick_deaths.saturating_add(1);
        }
        let delay = if quick_deaths == 0 {
            Duration::ZERO
        } else {
            backoff(quick_deaths)
        };
        match &end {
            End::TimedOut => {
                tracing::warn!(
                    helper = name,
                    slot = shared.index,
                    "helper did not answer in time; killed, restarting"
                )
            }
            other => {
                tracing::warn!(helper = name, slot = shared.index, end = %other, answered, restart_in = ?delay, "helper ended; restarting")
            }
        }
        if !delay.is_zero() && !wait_refusing(&mut jobs, delay).await {
            return;
        }
    }
}

/// Doubling from [`BACKOFF_FIRST`] to [`BACKOFF_MAX`] with the number of quick deaths (≥ 1).
fn backoff(quick_deaths: u32) -> Duration {
    let doublings = quick_deaths.saturating_sub(1).min(16);
    BACKOFF_FIRST
        .saturating_mul(1 << doublings)
        .min(BACKOFF_MAX)
}

/// Waits `delay`, handing back any job that arrives as never sent. False: the pool is gone.
async fn wait_refusing(jobs: &mut mpsc::UnboundedReceiver<Job>, delay: Duration) -> bool {
    let until = Instant::now() + delay;
    loop {
        tokio::select! {
            job = jobs.recv() => match job {
                Some(job) => {
                    let _ = job.reply.send(Err(Failure::NotSent));
                }
                None => return false,
            },
            () = tokio::time::sleep_until(until) => return true,
        }
    }
}

/// A request written to the child.
struct InFlight {
    job: Job,
    deadline: Instant,
}

/// Runs one child until it ends. Returns how and how many requests it answered.
async fn session(
    context: &SlotContext,
    shared: &SlotShared,
    mut child: Child,
    jobs: &mut mpsc::UnboundedReceiver<Job>,
) -> (End, u64) {
    let config = &context.config;
    let pid = child.id().unwrap_or(0);
    let (Some(mut stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        let _ = child.start_kill();
        return (End::Broken("no pipes to the child".into()), 0);
    };
    if let Some(stderr) = child.stderr.take() {
        tokio::spawn(log_stderr(config.name, pid, stderr));
    }
    let mut stdout = BufReader::new(stdout);
    shared.pid.store(pid, Ordering::Release);
    shared.live.store(true, Ordering::Release);
    context
        .live
        .send_modify(|generation| *generation = generation.wrapping_add(1));
    tracing::debug!(
        helper = config.name,
        slot = shared.index,
        pid,
        "helper started"
    );

    let concurrent = config.concurrency > 0;
    let mut in_flight: Vec<Option<InFlight>> =
        (0..config.concurrency.max(1)).map(|_| None).collect();
    let mut queue: VecDeque<Job> = VecDeque::new();
    let mut line = Vec::new();
    let mut answered = 0u64;
    let far = Duration::from_secs(86_400);

    let end = 'session: loop {
        // Fill the free channels.
        while let Some(channel) = in_flight.iter().position(Option::is_none) {
            let Some(job) = queue.pop_front() else { break };
            if job.reply.is_closed() {
                continue; // Its requester is gone.
            }
            match write_request(
                &mut stdin,
                concurrent.then_some(channel),
                &job.line,
                config.timeout,
            )
            .await
            {
                Ok(()) => {
                    context
                        .counters
                        .helper_requests
                        .fetch_add(1, Ordering::Relaxed);
                    in_flight[channel] = Some(InFlight {
                        job,
                        deadline: Instant::now() + config.timeout,
                    });
                }
                Err(WriteFailed::Io(error)) => {
                    queue.push_front(job);
                    break 'session End::Broken(format!("writing to the helper: {error}"));
                }
                Err(WriteFailed::Stuck) => {
                    in_flight[channel] = Some(InFlight {
                        job,
                        deadline: Instant::now(),
                    });
                    break 'session End::TimedOut;
                }
            }
        }
        let next_deadline = in_flight.iter().flatten().map(|f| f.deadline).min();
        let busy = next_deadline.is_some();
        tokio::select! {
            job = jobs.recv() => match job {
                Some(job) => queue.push_back(job),
                None => break End::Shutdown,
            },
            read = read_line(&mut stdout, &mut line, MAX_REPLY_LINE) => match read {
                Ok(Some(true)) => {
                    match deliver(&line, concurrent, &mut in_flight, config.name, shared.index) {
                        Ok(true) => answered += 1,
                        Ok(false) => {}
                        Err(bad) => break End::Broken(bad),
                    }
                    line.clear();
                }
                Ok(Some(false)) => break End::Broken("reply line too long".into()),
                Ok(None) => break End::Exited(None),
                Err(error) => break End::Broken(format!("reading from the helper: {error}")),
            },
            status = child.wait() => {
                // Replies it wrote before exiting are still in the pipe.
                while let Ok(Ok(Some(true))) = tokio::time::timeout(DRAIN_AFTER_EXIT, read_line(&mut stdout, &mut line, MAX_REPLY_LINE)).await {
                    if let Ok(true) = deliver(&line, concurrent, &mut in_flight, config.name, shared.index) {
                        answered += 1;
                    }
                    line.clear();
                }
                break End::Exited(status.ok());
            },
            () = tokio::time::sleep_until(next_deadline.unwrap_or_else(|| Instant::now() + far)), if busy => {
                break End::TimedOut;
            },
        }
    };

    shared.live.store(false, Ordering::Release);
    shared.pid.store(0, Ordering::Release);
    let _ = child.start_kill();
    // SIGKILL has been sent: reaping is immediate.
    let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;

    let now = Instant::now();
    let timed_out = matches!(end, End::TimedOut);
    for flight in in_flight.into_iter().flatten() {
        let failure = if timed_out && flight.deadline <= now {
            context.counters.timeouts.fetch_add(1, Ordering::Relaxed);
            Failure::TimedOut
        } else {
            Failure::Died
        };
        let _ = flight.job.reply.send(Err(failure));
    }
    for job in queue {
        let _ = job.reply.send(Err(Failure::NotSent));
    }
    (end, answered)
}

enum WriteFailed {
    Io(std::io::Error),
    /// The child does not read its stdin.
    Stuck,
}

async fn write_request(
    stdin: &mut ChildStdin,
    channel: Option<usize>,
    line: &str,
    timeout: Duration,
) -> Result<(), WriteFailed> {
    let mut out = String::with_capacity(line.len() + 8);
    if let Some(channel) = channel {
        let _ = write!(out, "{channel} ");
    }
    out.push_str(line);
    out.push('\n');
    match tokio::time::timeout(timeout, stdin.write_all(out.as_bytes())).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(error)) => Err(WriteFailed::Io(error)),
        Err(_) => Err(WriteFailed::Stuck),
    }
}

/// Hands a reply line to the request on its channel. `Ok(true)`: delivered; `Ok(false)`: no
/// request was waiting on that channel (logged, ignored); `Err`: the line is unusable and the
/// child cannot be trusted to stay in step.
fn deliver(
    line: &[u8],
    concurrent: bool,
    in_flight: &mut [Option<InFlight>],
    name: &'static str,
    slot: usize,
) -> Result<bool, String> {
    let reply = match parse_reply(line, concurrent) {
        Ok(reply) => reply,
        Err(BadReply::Empty) => {
            tracing::debug!(helper = name, slot, "empty line from helper ignored");
            return Ok(false);
        }
        Err(BadReply::NoChannel) => {
            return Err("reply without a channel-ID: does this helper support concurrency?".into())
        }
    };
    let channel = reply
        .channel
        .and_then(|c| usize::try_from(c).ok())
        .unwrap_or(0);
    match in_flight.get_mut(channel).and_then(Option::take) {
        Some(flight) => {
            let _ = flight.job.reply.send(Ok(reply));
            Ok(true)
        }
        None => {
            tracing::warn!(
                helper = name,
                slot,
                channel,
                "helper answered a channel with no request; ignored"
            );
            Ok(false)
        }
    }
}

/// Reads one line into `line` (appending; without the LF). `Some(true)`: a whole line;
/// `Some(false)`: `max` bytes without a line end (what was read stays in `line`); `None`: end
/// of stream. Cancel-safe: bytes taken from the reader are already in `line`.
async fn read_line<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    line: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<Option<bool>> {
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            return Ok(None);
        }
        let room = max.saturating_sub(line.len());
        if let Some(at) = available.iter().take(room + 1).position(|&b| b == b'\n') {
            line.extend_from_slice(&available[..at]);
            reader.consume(at + 1);
            return Ok(Some(true));
        }
        let n = available.len().min(room);
        line.extend_from_slice(&available[..n]);
        reader.consume(n);
        if line.len() >= max {
            return Ok(Some(false));
        }
    }
}

/// Copies a child's stderr to the log until it closes.
async fn log_stderr(name: &'static str, pid: u32, stderr: tokio::process::ChildStderr) {
    let mut reader = BufReader::new(stderr);
    let mut line = Vec::new();
    while let Ok(Some(_)) = read_line(&mut reader, &mut line, MAX_STDERR_LINE).await {
        let text = String::from_utf8_lossy(&line);
        let text = text.trim_end_matches('\r');
        if !text.is_empty() {
            tracing::info!(helper = name, pid, "helper stderr: {text}");
        }
        line.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reads_lines_bounded() {
        let data: &[u8] = b"OK\nERR long reason\n0123456789abcdef\npartial";
        let mut reader = BufReader::with_capacity(4, data);
        let mut line = Vec::new();
        assert_eq!(
            read_line(&mut reader, &mut line, 10).await.ok(),
            Some(Some(true))
        );
        assert_eq!(line, b"OK");
        line.clear();
        assert_eq!(
            read_line(&mut reader, &mut line, 10).await.ok(),
            Some(Some(false))
        );
        assert_eq!(line, b"ERR long r");
        line.clear();
        assert_eq!(
            read_line(&mut reader, &mut line, 10).await.ok(),
            Some(Some(true))
        );
        assert_eq!(line, b"eason");
        line.clear();
        assert_eq!(
            read_line(&mut reader, &mut line, 16).await.ok(),
            Some(Some(true))
        );
        assert_eq!(line, b"0123456789abcdef");
        line.clear();
        assert_eq!(read_line(&mut reader, &mut line, 16).await.ok(), Some(None));
    }

    #[test]
    fn backoff_doubles_to_a_cap() {
        assert_eq!(backoff(1), Duration::from_millis(100));
        assert_eq!(backoff(2), Duration::from_millis(200));
        assert_eq!(backoff(5), Duration::from_millis(1600));
        assert_eq!(backoff(10), BACKOFF_MAX);
        assert_eq!(backoff(u32::MAX), BACKOFF_MAX);
    }
}
