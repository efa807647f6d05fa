//! The runtime: one wasmtime engine per proxy, compiled modules cached by content, and every run
//! in a limited store whose instance is as instantiation left it.
//!
//! A run: a [`wasmtime::Store`] holds the request, the document and the run's limits; its
//! instance is one kept ready (below) or the module's pre-linked instance
//! ([`wasmtime::InstancePre`]) instantiated from the pooling allocator (no `mmap` per call);
//! `run` is called under an epoch
//! deadline (a ticker thread advances the engine's epoch every [`TICK`] while runs come, see
//! `ticker.rs`); the result, the
//! built response and the run's key/value writes and log records are kept only if it returned
//! normally with a valid code. Everything else is [`Verdict::Origin`] with the reason counted.
//!
//! Instances rewound: instantiating and releasing an instance (resetting its memory) are most of
//! a short run's cost. A module that qualifies is compiled instrumented (`rewind.rs`): it
//! records which pages of its memory it writes, so that after a run that completed normally its
//! instance is put back exactly as instantiation left it (those pages copied back from the
//! image, its mutable globals reset) and kept for the applet's next hit. Each run therefore
//! starts from a fresh instance's state, as the contract requires, without paying for one.
//!
//! Instances made ahead, for the rest (modules that do not qualify, and runs that faulted):
//! [`Runtime::run_deferred`] hands back the spent store with the verdict; the caller answers
//! first and then calls [`Runtime::replenish`], which releases it and instantiates the applet's
//! next instance, with no hit in its state yet, for the next hit to take. Nothing has run in
//! that instance (modules with a start function, which would run at instantiation, are
//! instantiated at their hit).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use wasmtime::{
    Config, Engine, InstanceAllocationStrategy, InstancePre, Linker, Module,
    PoolingAllocationConfig, Store, Trap, TypedFunc,
};

use crate::abi::{self, Outcome};
use crate::config::AppletConfig;
use crate::hit::{Built, Hit, Invocation, Items};
use crate::host::{self, Ended, RunState, VerifyMemo};
use crate::rewind::{self, Image, Rewind};
use crate::shard::{self, Sharded};
use crate::state::{KvStores, LogSpool};
use crate::ticker::Ticker;
use crate::AppletError;

/// Bytes at the start of an instance's memory that are zeroed in place when it is released,
/// rather than handed back to the kernel: the stack and the first heap pages of a small
/// applet, which every run touches. (Measured with `cargo bench -p meshcache-applet` and in
/// the proxy: handing them back made each run take two or three page faults, which cost more
/// than zeroing 32 KiB.)
const KEEP_RESIDENT: usize = 32 << 10;
pub use crate::ticker::TICK;

/// Why a run ended in "send it to the origin".
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reason {
    /// The applet asked for it.
    Asked,
    /// The applet trapped (the message says how).
    Trap(String),
    /// It ran out of CPU time.
    Timeout,
    /// It tried to grow its memory past the limit.
    Memory,
    /// It built a body larger than the limit.
    Output,
    /// It returned a code outside the contract.
    Invalid(i32),
    /// It could not be instantiated (the pool is exhausted, or its imports are wrong).
    Instantiate(String),
    /// Not run: it faulted `applets.quarantine_after` times in a row and is resting for
    /// `applets.quarantine`.
    Quarantined,
}

impl Reason {
    /// A short token for logs and `Cache-Status` details.
    pub fn token(&self) -> &'static str {
        match self {
            Reason::Asked => "asked",
            Reason::Trap(_) => "trap",
            Reason::Timeout => "timeout",
            Reason::Memory => "memory",
            Reason::Output => "output",
            Reason::Invalid(_) => "invalid",
            Reason::Instantiate(_) => "instantiate",
            Reason::Quarantined => "quarantined",
        }
    }
}

/// The decision a run reached.
#[derive(Clone, Debug)]
pub enum Verdict {
    /// Serve the cached copy.
    Cached,
    /// Serve this response.
    Built(Built),
    /// Send the request to the origin.
    Origin(Reason),
}

/// A compiled applet, ready to instantiate.
pub struct Applet {
    /// SHA-256 of the module's bytes.
    pub hash: [u8; 32],
    pre: InstancePre<RunState>,
    /// Whether instances may be made ahead of their hit (the module has no start function).
    warmable: bool,
    /// The exports naming its mutable globals, if it was compiled rewindable.
    rewindable: Option<Vec<String>>,
    /// Why it was not, if it was not.
    pub not_rewound: Option<String>,
    /// Its memory as instantiation leaves it (taken from its first instance).
    image: OnceLock<Arc<Image>>,
    /// Instances ready for the next hits: rewound after a run, or made ahead. Each thread
    /// keeps those it rewound in its own slot and looks there first, so that the lists'
    /// locks (and the instances' memory) stay with one core.
    // Boxed on purpose: a run takes one and puts it back without moving the instance.
    #[allow(clippy::vec_box)]
    warm: Sharded<Mutex<Vec<Box<Warm>>>>,
    /// Runs in a row that ended in a fault (trap, limit, invalid result).
    faults_in_a_row: AtomicU32,
    /// Until when (milliseconds on the runtime's clock) it is not run, after too many faults.
    quarantined_until: AtomicU64,
}

impl Applet {
    /// An instance kept ready, from the calling thread's slot (`mine`) if it has one, else
    /// from another thread's.
    fn ready(&self, mine: usize) -> Option<Box<Warm>> {
        if let Some(w) = self.warm.at(mine).lock().pop() {
            return Some(w);
        }
        self.warm
            .from(mine + 1)
            .take(shard::SHARDS - 1)
            .find_map(|s| s.lock().pop())
    }
}

impl std::fmt::Debug for Applet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Applet")
            .field("hash", &hex(&self.hash[..6]))
            .finish()
    }
}

/// An instance: ready for a hit (made ahead and never run, or rewound after a run), or running
/// one. Boxed, so that taking one for a run and putting it back move a pointer, not the
/// instance's handles (moving them, a few times per run, cost a `null` run a tenth of its time).
struct Warm {
    store: Store<RunState>,
    entry: TypedFunc<(), i32>,
    /// How to rewind it, if its module was compiled rewindable.
    rewind: Option<Rewind>,
    /// Its place in the runtime's count of instances kept ready, once it has been kept.
    counted: Option<Counted>,
}

/// One run in this many is timed for [`Counters::run_nanos`].
const TIMED_ONE_IN: u64 = 16;

/// The most instances one applet keeps ready in one thread's slot (runs of one applet at the
/// same time on one thread beyond this instantiate at their hit; a proxy's worker thread runs
/// one at a time).
const READY_PER_SLOT: usize = 2;

/// One in a count, for as long as it lives.
struct Counted(Arc<AtomicUsize>);

impl Counted {
    fn new(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Relaxed);
        Counted(count.clone())
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

/// What a run leaves behind: its store, whose release (resetting the instance's memory) can wait
/// until the answer is out. Dropping it releases it; [`Runtime::replenish`] also makes the
/// applet's next instance.
#[must_use = "dropping it releases the instance; pass it to Runtime::replenish after answering"]
pub struct Spent(
    Option<Store<RunState>>,
    /// The slot of the thread that ran it, where an instance made ahead for the next hit goes.
    usize,
);

impl Spent {
    /// Whether there is nothing to release: the run's instance was rewound and kept, or there
    /// was none.
    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }
}

impl std::fmt::Debug for Spent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Spent").field(&self.0.is_some()).finish()
    }
}

/// Compiled modules by content hash, the oldest loaded dropped beyond the bound (a module in
/// use stays alive with its users; only the cache forgets it).
#[derive(Default)]
struct Modules {
    by_hash: HashMap<[u8; 32], Arc<Applet>>,
    order: std::collections::VecDeque<[u8; 32]>,
}

impl Modules {
    fn insert(&mut self, hash: [u8; 32], applet: Arc<Applet>, max: usize) {
        if self.by_hash.insert(hash, applet).is_none() {
            self.order.push_back(hash);
        }
        while self.by_hash.len() > max {
            match self.order.pop_front() {
                Some(old) => {
                    self.by_hash.remove(&old);
                }
                None => break,
            }
        }
    }
}

/// What the runtime counts ([`Counters::get`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counter {
    /// Runs started.
    Runs,
    /// Runs that found their instance ready: made ahead, or rewound after an earlier run.
    MadeAhead,
    /// Runs that said "serve the cached copy".
    Cached,
    /// Runs after which their instance was rewound and kept for the next hit.
    Rewound,
    /// Runs that built a response.
    Built,
    /// Runs that asked for the origin.
    AskedOrigin,
    /// Total run time, nanoseconds, estimated: one run in 16 is timed, counting
    /// for that many (reading the clock twice cost a `null` applet's run about a tenth of its
    /// time).
    RunNanos,
    /// Runs that trapped.
    Traps,
    /// Runs stopped at their CPU deadline.
    Timeouts,
    /// Runs stopped at the memory limit.
    Memory,
    /// Runs whose output overran its limit.
    Output,
    /// Runs that returned an invalid code.
    Invalid,
    /// Runs that could not be instantiated.
    Instantiate,
    /// Hits not run because their applet was in quarantine.
    Quarantined,
    /// Times an applet was put in quarantine.
    Quarantines,
    /// Completed runs whose key/value writes did not fit the origin's bound (none applied).
    KvRejected,
    /// Modules compiled.
    Compiled,
    /// Modules that failed to compile or link.
    CompileFailed,
}

/// How many [`Counter`]s there are.
const COUNTERS: usize = Counter::CompileFailed as usize + 1;

/// Counters of what runs did; the proxy's metrics read them. Each thread counts in a block of
/// its own (`shard.rs`), all counters together, so that what one run counts (the run,
/// its instance found ready, its verdict, its rewind: the first four) is on one cache line.
#[derive(Debug, Default)]
pub struct Counters(Sharded<[AtomicU64; COUNTERS]>);

impl Counters {
    /// A counter's total (its threads' counts read one after the other: exact once the
    /// runs are over).
    pub fn get(&self, counter: Counter) -> u64 {
        self.0.from(0).fold(0u64, |total, block| {
            total.wrapping_add(block[counter as usize].load(Relaxed))
        })
    }

    /// Adds `n` to a counter, in the calling thread's block.
    pub(crate) fn add(&self, counter: Counter, n: u64) {
        self.0.mine()[counter as usize].fetch_add(n, Relaxed);
    }

    /// Adds one to a counter; returns the calling thread's count before it (not the total).
    fn bump_mine(&self, counter: Counter) -> u64 {
        self.0.mine()[counter as usize].fetch_add(1, Relaxed)
    }
}

/// The Active Cache runtime. One per proxy; shared by all requests.
pub struct Runtime {
    engine: Engine,
    linker: Linker<RunState>,
    config: AppletConfig,
    modules: Mutex<Modules>,
    kv: Arc<KvStores>,
    verified: Arc<VerifyMemo>,
    /// Log records waiting for delivery.
    pub logs: Arc<LogSpool>,
    /// What runs did.
    pub counters: Counters,
    ticker: Ticker,
    started: Instant,
    /// Instances kept ready, and how many may be (a quarter of the pool: the rest is for runs).
    warm: Arc<AtomicUsize>,
    max_warm: usize,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("modules", &self.modules.lock().by_hash.len())
            .finish()
    }
}

impl Runtime {
    /// Builds the engine (pooling instances, epoch interruption); its ticker starts with the
    /// first module.
    pub fn new(config: AppletConfig) -> Result<Self, AppletError> {
        config
            .validate()
            .map_err(|(key, why)| AppletError::Config(format!("{key}: {why}")))?;
        let mut pool = PoolingAllocationConfig::default();
        pool.total_core_instances(config.instances)
            .total_memories(config.instances)
            .total_tables(config.instances)
            .max_memories_per_module(1)
            .max_tables_per_module(1)
            .max_memory_size(config.memory as usize)
            // The rest of a released instance's memory goes back to the kernel in batches:
            // one system call (and one TLB shootdown across the proxy's threads) per 32 runs.
            .decommit_batch_size(32)
            .linear_memory_keep_resident(KEEP_RESIDENT)
            .table_keep_resident(4096);
        let mut wasm = Config::new();
        wasm.epoch_interruption(true)
            .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let engine = Engine::new(&wasm).map_err(|e| AppletError::Engine(e.to_string()))?;
        let mut linker = Linker::new(&engine);
        host::define(&mut linker).map_err(|e| AppletError::Engine(e.to_string()))?;
        Ok(Runtime {
            engine,
            linker,
            logs: Arc::new(LogSpool::new(config.log_queue)),
            modules: Mutex::new(Modules::default()),
            kv: Arc::new(KvStores::default()),
            verified: Arc::new(VerifyMemo::default()),
            counters: Counters::default(),
            ticker: Ticker::default(),
            started: Instant::now(),
            warm: Arc::new(AtomicUsize::new(0)),
            max_warm: config.instances as usize / 4,
            config,
        })
    }

    /// Starts the epoch ticker, once: with the first module, so that a proxy that never runs an
    /// applet has no thread waking a thousand times a second (nor one that stopped running
    /// them: the ticker sleeps after a quiet spell). No module is handed out unless the ticker
    /// runs (a run without it could not be stopped).
    fn start_ticker(&self) -> Result<(), AppletError> {
        self.ticker
            .start(self.engine.clone())
            .map_err(|e| AppletError::Engine(format!("cannot start the epoch ticker: {e}")))
    }

    /// The configuration it runs under.
    pub fn config(&self) -> &AppletConfig {
        &self.config
    }

    /// Compiles and links a module, or returns the one already compiled from the same bytes.
    /// Compiling takes milliseconds: call it off the request path's async threads.
    pub fn compile(&self, bytes: &[u8]) -> Result<Arc<Applet>, AppletError> {
        if bytes.len() as u64 > self.config.max_module {
            return Err(AppletError::TooLarge {
                size: bytes.len() as u64,
                max: self.config.max_module,
            });
        }
        self.start_ticker()?;
        let hash: [u8; 32] = Sha256::digest(bytes).into();
        if let Some(a) = self.modules.lock().by_hash.get(&hash) {
            return Ok(a.clone());
        }
        let compiled = self.compile_new(bytes, hash);
        match &compiled {
            Ok(a) => {
                self.counters.add(Counter::Compiled, 1);
                self.modules
                    .lock()
                    .insert(hash, a.clone(), self.config.max_modules);
            }
            Err(_) => {
                self.counters.add(Counter::CompileFailed, 1);
            }
        }
        compiled
    }

    fn compile_new(&self, bytes: &[u8], hash: [u8; 32]) -> Result<Arc<Applet>, AppletError> {
        let original = |bytes: &[u8]| {
            Module::new(&self.engine, bytes).map_err(|e| AppletError::Compile(format!("{e:#}")))
        };
        // Compiled instrumented if it qualifies (the rewrite adds exports and changes none),
        // else as given; a rewrite that does not compile (a bug here) falls back to the
        // module as given, whose own errors are then the ones reported.
        let (module, rewindable, not_rewound) = match rewind::instrument(bytes) {
            Ok(r) => match Module::new(&self.engine, &r.bytes) {
                Ok(m) if m.get_export(rewind::RUN).is_some() => (m, Some(r.globals), None),
                // No entry point of its own to wrap (an imported `run`, or none: the check
                // below then says so).
                Ok(_) => (
                    original(bytes)?,
                    None,
                    Some("its entry point is not a function of its own".into()),
                ),
                Err(e) => (
                    original(bytes)?,
                    None,
                    Some(format!("the rewrite does not compile: {e:#}")),
                ),
            },
            Err(why) => (original(bytes)?, None, Some(why.0)),
        };
        check_exports(&module)?;
        if let Some(why) = &not_rewound {
            tracing::info!(
                module = %hex(&hash[..6]),
                why = %why,
                "applet runs in a fresh instance per hit (it cannot be rewound)"
            );
        }
        let pre = self
            .linker
            .instantiate_pre(&module)
            .map_err(|e| AppletError::Link(format!("{e:#}")))?;
        Ok(Arc::new(Applet {
            hash,
            pre,
            warmable: !has_start_function(bytes),
            rewindable,
            not_rewound,
            image: OnceLock::new(),
            warm: Sharded::default(),
            faults_in_a_row: AtomicU32::new(0),
            quarantined_until: AtomicU64::new(0),
        }))
    }

    /// Instances made ahead and waiting for their hit.
    pub fn ready_ahead(&self) -> usize {
        self.warm.load(Relaxed)
    }

    /// Times the epoch ticker went to sleep after a quiet spell (see `ticker.rs`).
    pub fn ticker_sleeps(&self) -> u64 {
        self.ticker.sleeps()
    }

    /// Modules compiled and kept.
    pub fn modules(&self) -> usize {
        self.modules.lock().by_hash.len()
    }

    /// Bytes one origin's store holds.
    pub fn kv_bytes(&self, origin: &str) -> u64 {
        self.kv.bytes(origin)
    }

    /// Runs `applet` for one hit. Blocks for at most the CPU budget (plus a tick).
    pub fn run(&self, applet: &Applet, mut inv: Invocation, items: Arc<dyn Items>) -> Verdict {
        self.run_deferred(applet, inv.lend(), &items).0
    }

    /// Runs `applet` for one hit, as [`run`](Self::run), and hands back the spent store: pass
    /// it to [`replenish`](Self::replenish) once the answer is out.
    pub fn run_deferred(
        &self,
        applet: &Applet,
        hit: Hit<'_>,
        items: &Arc<dyn Items>,
    ) -> (Verdict, Spent) {
        let mine = shard::mine();
        let until = applet.quarantined_until.load(Relaxed);
        if until != 0 && until > self.clock_ms() {
            self.counters.add(Counter::Quarantined, 1);
            return (Verdict::Origin(Reason::Quarantined), Spent(None, mine));
        }
        let started =
            (self.counters.bump_mine(Counter::Runs) % TIMED_ONE_IN == 0).then(Instant::now);
        let ticks = self.deadline_ticks(hit.document.body.len());
        let running = self.ticker.running();
        let (mut warm, lent) = match applet.ready(mine) {
            Some(mut warm) => {
                self.counters.add(Counter::MadeAhead, 1);
                let lent = warm.store.data_mut().begin(hit, items);
                warm.store.set_epoch_deadline(ticks);
                (warm, lent)
            }
            None => {
                // The hit is the state's before instantiating: a start function runs then.
                let mut store = self.new_store();
                let lent = store.data_mut().begin(hit, items);
                store.set_epoch_deadline(ticks);
                match self.instantiate(applet, &mut store) {
                    Ok((entry, rewind)) => {
                        let warm = Warm {
                            store,
                            entry,
                            rewind,
                            counted: None,
                        };
                        (Box::new(warm), lent)
                    }
                    Err(reason) => {
                        drop(running);
                        drop(store.data_mut().end(lent));
                        let verdict = Verdict::Origin(reason);
                        return self.finish(applet, verdict, Spent(Some(store), mine), started);
                    }
                }
            }
        };
        let called = self.call(&mut warm);
        drop(running);
        let Ended {
            kv,
            log_to,
            output,
            kv_writes,
            log,
        } = warm.store.data_mut().end(lent);
        let verdict = match called {
            Ok(outcome) => {
                // A normal completion: its writes and log records are kept, whatever it chose.
                if !kv_writes.is_empty()
                    && !kv.is_some_and(|kv| kv.lock().commit(kv_writes, self.config.kv_max))
                {
                    self.counters.add(Counter::KvRejected, 1);
                }
                if let Some(log_to) = log_to {
                    self.logs.push(&log_to, log);
                }
                match (outcome, output) {
                    (Outcome::Built, Some(out)) => Verdict::Built(out.finish()),
                    (Outcome::Origin, _) => Verdict::Origin(Reason::Asked),
                    _ => Verdict::Cached,
                }
            }
            Err(reason) => Verdict::Origin(reason),
        };
        let spent = if completed(&verdict) && warm.rewind.is_some() {
            self.keep_rewound(applet, warm, mine)
        } else {
            Spent(Some(warm.store), mine)
        };
        self.finish(applet, verdict, spent, started)
    }

    /// A run's end: its verdict counted (and, if it faulted, toward a quarantine), and its
    /// time if it was timed.
    fn finish(
        &self,
        applet: &Applet,
        verdict: Verdict,
        spent: Spent,
        started: Option<Instant>,
    ) -> (Verdict, Spent) {
        let c = &self.counters;
        let counted = match &verdict {
            Verdict::Cached => Counter::Cached,
            Verdict::Built(_) => Counter::Built,
            Verdict::Origin(Reason::Asked) => Counter::AskedOrigin,
            Verdict::Origin(Reason::Trap(_)) => Counter::Traps,
            Verdict::Origin(Reason::Timeout) => Counter::Timeouts,
            Verdict::Origin(Reason::Memory) => Counter::Memory,
            Verdict::Origin(Reason::Output) => Counter::Output,
            Verdict::Origin(Reason::Invalid(_)) => Counter::Invalid,
            Verdict::Origin(Reason::Instantiate(_)) => Counter::Instantiate,
            Verdict::Origin(Reason::Quarantined) => Counter::Quarantined,
        };
        c.add(counted, 1);
        self.note_fault(applet, &verdict);
        if let Some(started) = started {
            let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
            c.add(Counter::RunNanos, nanos.saturating_mul(TIMED_ONE_IN));
        }
        (verdict, spent)
    }

    /// After a run that completed normally in an instance that can be rewound: rewinds it and
    /// keeps it for the next hit, if there is room (it keeps its place in the count of
    /// instances kept ready if it had one); otherwise hands it back to be released. `mine` is
    /// the calling thread's slot of the applet's ready lists.
    fn keep_rewound(&self, applet: &Applet, mut warm: Box<Warm>, mine: usize) -> Spent {
        if warm.counted.is_none() && self.warm.load(Relaxed) >= self.max_warm {
            return Spent(Some(warm.store), mine);
        }
        let written = warm.store.data_mut().take_dirty();
        match &warm.rewind {
            Some(rewind) if rewind.rewind(&mut warm.store, written) => {}
            _ => return Spent(Some(warm.store), mine),
        }
        let mut ready = applet.warm.at(mine).lock();
        if ready.len() >= READY_PER_SLOT {
            // Enough are kept already (this one was rewound for nothing: rare, and cheaper
            // than a second look at the list).
            drop(ready);
            return Spent(Some(warm.store), mine);
        }
        if warm.counted.is_none() {
            warm.counted = Some(Counted::new(&self.warm));
        }
        ready.push(warm);
        drop(ready);
        self.counters.add(Counter::Rewound, 1);
        Spent(None, mine)
    }

    /// After a run's answer is out: releases what the run left and, unless the applet has one
    /// or the pool's share for them is taken, makes its next instance ahead of the next hit
    /// (kept in the slot of the thread that ran the last, where that thread looks first).
    pub fn replenish(&self, applet: &Applet, spent: Spent) {
        if spent.is_empty() {
            // Nothing to release: the run's instance was rewound and kept (or the run had
            // none, and its next hit will instantiate).
            return;
        }
        let slot = spent.1;
        drop(spent);
        if !applet.warmable
            || self.warm.load(Relaxed) >= self.max_warm
            || !applet.warm.at(slot).lock().is_empty()
        {
            return;
        }
        let mut store = self.new_store();
        // Instantiating runs no code of a module without a start function; the deadline is
        // there in case that ever changes. Each run sets its own.
        store.set_epoch_deadline(self.deadline_ticks(0));
        let Ok((entry, rewind)) = self.instantiate(applet, &mut store) else {
            // The pool is busy, or the module cannot be instantiated: its hit will say why.
            return;
        };
        let warm = Box::new(Warm {
            store,
            entry,
            rewind,
            counted: Some(Counted::new(&self.warm)),
        });
        let mut ready = applet.warm.at(slot).lock();
        if ready.is_empty() {
            ready.push(warm);
        } else {
            drop(ready);
            drop(warm);
        }
    }

    /// Instantiates the applet in `store`: its entry point, and how to rewind it if it can be.
    fn instantiate(
        &self,
        applet: &Applet,
        store: &mut Store<RunState>,
    ) -> Result<(TypedFunc<(), i32>, Option<Rewind>), Reason> {
        let instance = applet
            .pre
            .instantiate(&mut *store)
            .map_err(|e| classify(store.data(), e, true))?;
        let memory = instance
            .get_memory(&mut *store, abi::MEMORY)
            .ok_or_else(|| Reason::Instantiate("no exported memory".into()))?;
        store.data_mut().memory = Some(memory);
        let entry = instance
            .get_typed_func::<(), i32>(&mut *store, abi::ENTRY)
            .map_err(|e| Reason::Instantiate(e.to_string()))?;
        let rewind = applet.rewindable.as_ref().and_then(|globals| {
            Rewind::new(&mut *store, &instance, memory, globals, &applet.image)
        });
        Ok((entry, rewind))
    }

    /// The epoch deadline of a run over a document of `size` bytes, in ticks.
    fn deadline_ticks(&self, size: usize) -> u64 {
        let budget = self.config.cpu_budget(size);
        budget.as_micros().div_ceil(TICK.as_micros()) as u64 + 1
    }

    /// A fresh store, for an instance to run in now or to keep ready.
    fn new_store(&self) -> Store<RunState> {
        let state = RunState::new(self.kv.clone(), self.verified.clone(), &self.config);
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limiter);
        // A run past its deadline traps (each run sets its deadline).
        store.epoch_deadline_trap();
        store
    }

    /// Calls the applet's entry point in `warm`: the outcome, or why there is none.
    fn call(&self, warm: &mut Warm) -> Result<Outcome, Reason> {
        let store = &mut warm.store;
        let code = match &warm.rewind {
            // One entry into the instance: the mask comes back with the result.
            Some(r) => r.run(&mut *store).map(|(code, marked)| {
                store.data_mut().mark(marked);
                code
            }),
            None => warm.entry.call(&mut *store, ()),
        }
        .map_err(|e| classify(store.data(), e, false))?;
        let state = store.data();
        if state.output_overrun {
            return Err(Reason::Output);
        }
        match Outcome::from_code(code) {
            Some(Outcome::Built) if state.output.is_none() => Err(Reason::Invalid(code)),
            Some(o) => Ok(o),
            None => Err(Reason::Invalid(code)),
        }
    }
}

impl Runtime {
    /// Milliseconds since the runtime started (the quarantine clock).
    fn clock_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Counts faults in a row; too many put the applet in quarantine.
    fn note_fault(&self, applet: &Applet, verdict: &Verdict) {
        let fault = matches!(
            verdict,
            Verdict::Origin(
                Reason::Trap(_)
                    | Reason::Timeout
                    | Reason::Memory
                    | Reason::Output
                    | Reason::Invalid(_)
            )
        );
        if !fault {
            // Written only when there is something to clear: a store, even of the same value,
            // takes the line from every other core that reads it.
            if applet.faults_in_a_row.load(Relaxed) != 0 {
                applet.faults_in_a_row.store(0, Relaxed);
            }
            return;
        }
        let n = applet.faults_in_a_row.fetch_add(1, Relaxed) + 1;
        let after = self.config.quarantine_after;
        if after > 0 && n >= after {
            applet.faults_in_a_row.store(0, Relaxed);
            let until = self.clock_ms() + self.config.quarantine.as_millis() as u64;
            applet.quarantined_until.store(until, Relaxed);
            self.counters.add(Counter::Quarantines, 1);
            tracing::warn!(
                module = %hex(&applet.hash[..6]),
                faults = n,
                rest = ?self.config.quarantine,
                "applet quarantined: its documents' hits go to the origin without running it"
            );
        }
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.ticker.stop();
    }
}

#[cfg(test)]
impl Applet {
    /// Whether it was compiled rewindable.
    pub(crate) fn rewindable(&self) -> bool {
        self.rewindable.is_some()
    }

    /// How many instances it keeps ready, and whether each rewound one holds exactly what
    /// instantiation gave it.
    pub(crate) fn ready_as_made(&self) -> (usize, bool) {
        let (mut n, mut as_made) = (0, true);
        for slot in self.warm.from(0) {
            let mut ready = slot.lock();
            n += ready.len();
            as_made &= ready.iter_mut().all(|w| match &w.rewind {
                Some(r) => r.is_as_made(&mut w.store),
                None => true,
            });
        }
        (n, as_made)
    }
}

/// Whether a run completed normally (its instance may then be rewound and run again).
fn completed(verdict: &Verdict) -> bool {
    matches!(
        verdict,
        Verdict::Cached | Verdict::Built(_) | Verdict::Origin(Reason::Asked)
    )
}

/// Why a call failed, from the error and what the run's state recorded.
fn classify(state: &RunState, e: wasmtime::Error, instantiating: bool) -> Reason {
    if state.limiter.memory_denied {
        return Reason::Memory;
    }
    if state.output_overrun {
        return Reason::Output;
    }
    match e.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => Reason::Timeout,
        Some(t) => Reason::Trap(t.to_string()),
        None if instantiating => Reason::Instantiate(format!("{e:#}")),
        None => Reason::Trap(format!("{e:#}")),
    }
}

/// Whether the module has a start function, which runs at instantiation (and could call the
/// host before there is a hit). A module that does not parse has none here; compiling it fails.
fn has_start_function(bytes: &[u8]) -> bool {
    wasmtime::wasmparser::Parser::new(0)
        .parse_all(bytes)
        .any(|p| matches!(p, Ok(wasmtime::wasmparser::Payload::StartSection { .. })))
}

/// A module must export `memory` and `run: () -> i32`.
fn check_exports(module: &Module) -> Result<(), AppletError> {
    let mut memory = false;
    let mut entry = false;
    for export in module.exports() {
        match (export.name(), export.ty()) {
            (abi::MEMORY, wasmtime::ExternType::Memory(_)) => memory = true,
            (abi::ENTRY, wasmtime::ExternType::Func(f)) => {
                entry = f.params().len() == 0
                    && f.results().len() == 1
                    && matches!(f.results().next(), Some(wasmtime::ValType::I32));
            }
            _ => {}
        }
    }
    if !memory {
        return Err(AppletError::Link("the module exports no memory".into()));
    }
    if !entry {
        return Err(AppletError::Link(
            "the module exports no `run: () -> i32`".into(),
        ));
    }
    Ok(())
}

/// Lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
