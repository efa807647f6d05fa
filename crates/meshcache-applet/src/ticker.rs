//! The epoch ticker: a thread that advances the engine's epoch every [`TICK`], which is what
//! stops a run at its CPU deadline, and sleeps once no run has begun for [`IDLE_TICKS`] ticks.
//!
//! Without the sleep, a proxy that had ever compiled an applet woke a thousand times a second
//! for the rest of its life. A run that begins while the ticker sleeps wakes it (one `futex`
//! call, only after such a quiet spell; otherwise beginning a run costs one atomic add and one
//! load, and ending it one atomic subtraction), and its deadline counts from the epoch at its
//! start, as always.
//!
//! Why no run can go unticked: a run announces itself (one add to its thread's slot of `runs`,
//! which counts the runs begun and the runs in progress) and then reads `asleep`; the ticker
//! sets `asleep` and then reads every slot of `runs` again before it parks. All these accesses
//! are sequentially consistent, so either the run sees `asleep` and wakes the ticker, or the
//! ticker sees the run and keeps ticking.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, OnceLock};
use std::thread::{JoinHandle, Thread};
use std::time::Duration;

use parking_lot::Mutex;
use wasmtime::Engine;

use crate::shard::{self, Padded, Sharded};

/// How often the engine's epoch advances: the granularity of CPU deadlines (a run is stopped
/// between its budget and one tick after). Every tick is a wake-up on a core the proxy's
/// threads need: at 1 ms the ticker thread took 0.9 % of the proxy's CPU samples under load
/// (`perf record` at 10 clients; about 0.2 µs per hit at 50,000 hits/s, before the switches it
/// forces on the workers); 5 ms keeps deadlines within a quarter of the default 20 ms budget.
pub const TICK: Duration = Duration::from_millis(5);

/// Ticks with no run begun and none running after which the ticker sleeps (100 ms).
pub(crate) const IDLE_TICKS: u32 = 20;

/// One run begun, in [`State::runs`].
const BEGAN: u64 = 1 << 32;
/// The runs in progress, in [`State::runs`].
const RUNNING: u64 = BEGAN - 1;

#[derive(Default)]
struct State {
    /// Per thread: runs begun since start (the high 32 bits, wrapping) and runs in progress
    /// (the low 32 bits): one word, so that beginning a run is one atomic operation, in a slot
    /// of the thread's own (see [`crate::shard`]). A run ends on the thread it began on. The
    /// ticker compares the runs begun from one tick to the next, which cannot be 2^32 apart.
    runs: Sharded<AtomicU64>,
    /// The ticker is parked, or about to park (alone on its line: every run reads it).
    asleep: Padded<AtomicBool>,
    stop: AtomicBool,
    /// Times the ticker went to sleep.
    sleeps: AtomicU64,
    thread: OnceLock<Thread>,
}

/// The ticker of one engine; see the [module documentation](self).
#[derive(Default)]
pub(crate) struct Ticker {
    state: Arc<State>,
    handle: Mutex<Option<JoinHandle<()>>>,
}

/// A run in progress: keeps the ticker awake until dropped.
pub(crate) struct Running<'a>(&'a AtomicU64);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, SeqCst);
    }
}

impl State {
    /// Runs begun and in progress, over all threads (in the layout of one slot).
    fn runs(&self) -> u64 {
        self.runs
            .from(0)
            .fold(0u64, |t, s| t.wrapping_add(s.load(SeqCst)))
    }
}

impl Ticker {
    /// Starts the thread, once.
    pub fn start(&self, engine: Engine) -> std::io::Result<()> {
        let mut handle = self.handle.lock();
        if handle.is_some() {
            return Ok(());
        }
        let state = self.state.clone();
        let thread = std::thread::Builder::new()
            .name("applet-epoch".into())
            .spawn(move || tick(&state, &engine))?;
        *handle = Some(thread);
        Ok(())
    }

    /// A run begins: wakes the ticker if it sleeps, and keeps it awake while the guard lives.
    pub fn running(&self) -> Running<'_> {
        let s = &*self.state;
        let mine = s.runs.at(shard::mine());
        mine.fetch_add(BEGAN + 1, SeqCst);
        if s.asleep.load(SeqCst) && s.asleep.swap(false, SeqCst) {
            if let Some(t) = s.thread.get() {
                t.unpark();
            }
        }
        Running(mine)
    }

    /// Times the ticker went to sleep since start.
    pub fn sleeps(&self) -> u64 {
        self.state.sleeps.load(SeqCst)
    }

    /// Stops the thread and waits for it.
    pub fn stop(&mut self) {
        let s = &*self.state;
        s.stop.store(true, SeqCst);
        s.asleep.store(false, SeqCst);
        if let Some(t) = s.thread.get() {
            t.unpark();
        }
        if let Some(h) = self.handle.get_mut().take() {
            let _ = h.join();
        }
    }
}

/// The ticker thread's loop.
fn tick(s: &State, engine: &Engine) {
    // Known before `asleep` can first be set, so a run that sees it set can wake us.
    let _ = s.thread.set(std::thread::current());
    // The runs begun when last looked at (with the runs in progress, which must be none for
    // the ticker to count a quiet tick).
    let mut seen = s.runs() & !RUNNING;
    let mut quiet = 0;
    while !s.stop.load(SeqCst) {
        std::thread::sleep(TICK);
        engine.increment_epoch();
        let runs = s.runs();
        if runs != seen {
            seen = runs & !RUNNING;
            quiet = 0;
            continue;
        }
        quiet += 1;
        if quiet < IDLE_TICKS {
            continue;
        }
        s.asleep.store(true, SeqCst);
        if s.runs() != seen {
            // A run began after the look above and may not have seen `asleep`: keep ticking.
            s.asleep.store(false, SeqCst);
            continue;
        }
        s.sleeps.fetch_add(1, SeqCst);
        while s.asleep.load(SeqCst) && !s.stop.load(SeqCst) {
            std::thread::park();
        }
        seen = s.runs() & !RUNNING;
        quiet = 0;
    }
}
