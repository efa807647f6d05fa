//! Where a node's time goes: answering its clients, answering its peers, searching its peers
//! for its own misses, and everything else (the hierarchy-evaluation framework's efficiency).
//!
//! Work in a tokio program happens inside `poll` of some future, so each future that does one
//! kind of work is wrapped in [`Timed`], which adds the time spent in each of its polls to a
//! per-[`Category`] counter:
//!
//! * a client connection (`server.rs`) is `client` or `peer` work, by who sent the request
//!   being served ([`ConnCategory`], set per request): parsing, lookup, the response body;
//! * an upstream connection's own task (`upstream.rs`, reading the origin's or parent's
//!   response) takes the category of the request that last used it;
//! * this node's ICP search (`coop::route`: the decision and sending the queries) is `search`,
//!   and so is handling the replies in the ICP loop; answering other nodes' queries is `peer`.
//!
//! Timed polls nest (a search runs inside a client connection's poll), and each counts only
//! its own time: the inner poll's time is taken off the outer one's. That bookkeeping follows
//! the poll stack, which is per thread, so it lives in a thread-local that holds nothing
//! between polls; it is the one place where we keep state outside a struct, because the poll
//! stack is not ours to pass arguments through.
//!
//! The figures are wall time inside `poll`, read with [`Instant`]: on a machine with idle
//! cores that is CPU time, but when the thread is preempted mid-poll the wait counts too, so
//! under CPU contention the categories can add up to more than the process's CPU time.
//! Everything else (tokio's scheduler, timers, the admin listener, the access log flush,
//! CONNECT tunnels, background refreshes) is *overhead*: process CPU time
//! ([`process_cpu_seconds`], from `/proc/self/stat`) minus the three categories.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// A kind of work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Category {
    /// Serving requests from clients that are not peers.
    Client = 0,
    /// Serving peers: their HTTP requests and their ICP queries.
    Peer = 1,
    /// This node's own ICP searches: deciding, sending queries, handling replies.
    Search = 2,
}

const NONE: u8 = u8::MAX;

impl Category {
    fn from_u8(v: u8) -> Option<Category> {
        match v {
            0 => Some(Category::Client),
            1 => Some(Category::Peer),
            2 => Some(Category::Search),
            _ => None,
        }
    }
}

thread_local! {
    /// Nanoseconds spent in timed polls nested inside the timed poll running on this thread.
    static NESTED_NS: Cell<u64> = const { Cell::new(0) };
    /// The category of the timed poll running on this thread ([`NONE`] outside any).
    static CURRENT: Cell<u8> = const { Cell::new(NONE) };
}

/// The category of the work this thread is doing now, if it runs inside a [`Timed`] poll.
pub fn current() -> Option<Category> {
    Category::from_u8(CURRENT.with(Cell::get))
}

/// Time per category, and requests by sender.
#[derive(Debug, Default)]
pub struct Efficiency {
    ns: [AtomicU64; 3],
    /// HTTP requests received from clients.
    pub from_clients: AtomicU64,
    /// HTTP requests received from peers (configured peers and ICP-allowed child caches).
    pub from_peers: AtomicU64,
}

impl Efficiency {
    /// Adds `d` to `category`.
    pub fn add(&self, category: Category, d: Duration) {
        self.add_ns(category, u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    }

    fn add_ns(&self, category: Category, ns: u64) {
        self.ns[category as usize].fetch_add(ns, Relaxed);
    }

    /// Seconds spent on `category` so far.
    pub fn seconds(&self, category: Category) -> f64 {
        self.ns[category as usize].load(Relaxed) as f64 / 1e9
    }

    /// Counts one HTTP request received, by sender.
    pub fn count_request(&self, category: Category) {
        match category {
            Category::Peer => &self.from_peers,
            _ => &self.from_clients,
        }
        .fetch_add(1, Relaxed);
    }

    /// The figures, with `cpu_s` the process's CPU time (when known).
    pub fn report(&self, cpu_s: Option<f64>) -> EfficiencyReport {
        let client_s = self.seconds(Category::Client);
        let peer_s = self.seconds(Category::Peer);
        let search_s = self.seconds(Category::Search);
        EfficiencyReport {
            client_s,
            peer_s,
            search_s,
            cpu_s,
            overhead_s: cpu_s.map(|cpu| (cpu - client_s - peer_s - search_s).max(0.0)),
        }
    }
}

/// What `/stats` shows under `efficiency`, in seconds.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct EfficiencyReport {
    /// Serving clients.
    pub client_s: f64,
    /// Serving peers.
    pub peer_s: f64,
    /// Searching peers for our own misses.
    pub search_s: f64,
    /// The process's CPU time (user and system), when it can be read.
    pub cpu_s: Option<f64>,
    /// `cpu_s` minus the three above, at least 0.
    pub overhead_s: Option<f64>,
}

/// The category of a connection, which may change from one request to the next.
#[derive(Debug)]
pub struct ConnCategory(AtomicU8);

impl ConnCategory {
    /// Starts in `category`.
    #[cfg(test)]
    pub fn new(category: Category) -> Self {
        ConnCategory(AtomicU8::new(category as u8))
    }

    /// A connection not attributed to anything yet (its time is overhead until [`Self::set`]).
    pub fn unattributed() -> Self {
        ConnCategory(AtomicU8::new(NONE))
    }

    /// The category now.
    pub fn get(&self) -> Option<Category> {
        Category::from_u8(self.0.load(Relaxed))
    }

    /// Changes the category.
    pub fn set(&self, category: Category) {
        self.0.store(category as u8, Relaxed);
    }

    /// Changes the category to `category`, or to nothing (overhead) for `None`.
    pub fn set_or_clear(&self, category: Option<Category>) {
        self.0.store(category.map_or(NONE, |c| c as u8), Relaxed);
    }

    /// Changes the category from inside this connection's own timed poll, so that work started
    /// in the rest of the poll (e.g. an upstream request) sees it through [`current`].
    pub fn begin_request(&self, category: Category) {
        self.set(category);
        CURRENT.with(|c| c.set(category as u8));
    }
}

/// Where a [`Timed`] future's category comes from.
#[derive(Clone, Copy, Debug)]
pub enum Source<'a> {
    /// Always this one.
    Fixed(Category),
    /// Whatever the cell says at the end of each poll.
    Cell(&'a ConnCategory),
}

impl Source<'_> {
    fn get(&self) -> Option<Category> {
        match self {
            Source::Fixed(c) => Some(*c),
            Source::Cell(cell) => cell.get(),
        }
    }
}

/// A future whose polls are timed and added to a category (see the module doc).
pub struct Timed<'a, F> {
    inner: F,
    counters: &'a Efficiency,
    source: Source<'a>,
}

impl<'a, F: Future + Unpin> Timed<'a, F> {
    /// Times `inner` (pin it first: `tokio::pin!`, or pass a `Pin<&mut _>`).
    pub fn new(inner: F, counters: &'a Efficiency, source: Source<'a>) -> Self {
        Timed {
            inner,
            counters,
            source,
        }
    }
}

impl<F: Future + Unpin> Future for Timed<'_, F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        let at_start = this.source.get().map_or(NONE, |c| c as u8);
        let outer_nested = NESTED_NS.with(|n| n.replace(0));
        let outer_current = CURRENT.with(|c| c.replace(at_start));
        let start = Instant::now();
        let out = Pin::new(&mut this.inner).poll(cx);
        let elapsed = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let nested = NESTED_NS.with(|n| n.replace(outer_nested.saturating_add(elapsed)));
        CURRENT.with(|c| c.set(outer_current));
        // Read at the end: the poll that took a new request is that request's work.
        if let Some(category) = this.source.get() {
            this.counters
                .add_ns(category, elapsed.saturating_sub(nested));
        }
        out
    }
}

/// Clock ticks per second of `/proc` CPU times: `getconf CLK_TCK`, or 100 (Linux's value on
/// the usual architectures) when that cannot be run.
pub fn clock_ticks() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse::<u64>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(100)
}

/// The process's CPU time (user + system, all threads, exited ones included) in seconds, from
/// `/proc/self/stat`; `None` where there is no such file.
pub fn process_cpu_seconds(ticks_per_second: u64) -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    cpu_seconds_from_stat(&stat, ticks_per_second)
}

/// utime (field 14) + stime (field 15) of a `/proc/PID/stat` line, in seconds. The command
/// name (field 2) is in parentheses and may hold spaces and parentheses: fields are counted
/// after its last `)`.
fn cpu_seconds_from_stat(stat: &str, ticks_per_second: u64) -> Option<f64> {
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((utime + stime) as f64 / ticks_per_second.max(1) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_line_is_parsed_after_the_command_name() {
        let line =
            "4242 (my (odd) cmd) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 50 0 0 20 0 9 0 100 0 0";
        assert_eq!(cpu_seconds_from_stat(line, 100), Some(3.0));
        assert_eq!(cpu_seconds_from_stat("garbage", 100), None);
        assert!(process_cpu_seconds(clock_ticks()).is_some_and(|s| s >= 0.0));
    }

    /// A future that burns `spin` of time in each of its `polls` polls, polling `nested` too.
    struct Spin<'a> {
        polls: u32,
        spin: Duration,
        nested: Option<Pin<Box<dyn Future<Output = ()> + Unpin + 'a>>>,
    }

    impl Future for Spin<'_> {
        type Output = ();
        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            let start = Instant::now();
            while start.elapsed() < self.spin {
                std::hint::spin_loop();
            }
            if let Some(n) = self.nested.as_mut() {
                if n.as_mut().poll(cx).is_ready() {
                    self.nested = None;
                }
            }
            if self.polls <= 1 {
                return Poll::Ready(());
            }
            self.polls -= 1;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }

    #[tokio::test]
    async fn nested_time_is_counted_once_in_the_inner_category() {
        let counters = Efficiency::default();
        let cell = ConnCategory::new(Category::Client);
        let spin = Duration::from_millis(20);
        let inner = Timed::new(
            Spin {
                polls: 2,
                spin,
                nested: None,
            },
            &counters,
            Source::Fixed(Category::Search),
        );
        let outer = Spin {
            polls: 3,
            spin,
            nested: Some(Box::pin(inner)),
        };
        let start = Instant::now();
        Timed::new(outer, &counters, Source::Cell(&cell)).await;
        let wall = start.elapsed().as_secs_f64();
        let client = counters.seconds(Category::Client);
        let search = counters.seconds(Category::Search);
        // Three outer spins and two inner ones.
        assert!(client >= 3.0 * spin.as_secs_f64(), "{client}");
        assert!(search >= 2.0 * spin.as_secs_f64(), "{search}");
        // Counted once: had the outer figure kept the inner polls' time, the sum would hold
        // seven spins, more than the five that passed.
        assert!(client + search <= wall, "{client} + {search} > {wall}");
        assert_eq!(counters.seconds(Category::Peer), 0.0);
        assert_eq!(current(), None);
    }

    #[test]
    fn report_never_shows_negative_overhead() {
        let e = Efficiency::default();
        e.add(Category::Client, Duration::from_millis(1500));
        e.add(Category::Peer, Duration::from_millis(250));
        let r = e.report(Some(1.0));
        assert_eq!(r.overhead_s, Some(0.0));
        let r = e.report(Some(3.0));
        assert!((r.overhead_s.expect("known") - 1.25).abs() < 1e-9);
        assert_eq!(e.report(None).overhead_s, None);
    }
}
