//! The host functions of [`crate::abi`]: what a run may read, build and keep, each bounded.
//!
//! A function given a pointer range outside the applet's memory traps the run. A function that
//! would pass a bound returns `-1` and does nothing; passing the output bound also marks the run
//! so its result cannot be served.

use std::borrow::Cow;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use parking_lot::Mutex;
use wasmtime::{Caller, Linker, Memory, ResourceLimiter, StoreLimits, StoreLimitsBuilder};

use crate::abi::{self, Input};
use crate::config::AppletConfig;
use crate::hit::{Built, Hit, Item, Items};
use crate::state::{KvStore, KvStores, KvWrites, MAX_KEY};

/// The most objects one run may open (the document included).
const MAX_OPEN: usize = 64;
/// The most headers a built response may carry.
const MAX_HEADERS: usize = 64;
/// The longest header (name plus value) a built response may carry.
const MAX_HEADER_BYTES: usize = 8 << 10;
/// The longest `item_find` needle whose searcher is kept from one call (and run) to the next.
const MAX_KEPT_NEEDLE: usize = 256;
/// The largest URL buffer an instance keeps for its next run (a longer URL's is let go).
const KEEP_URL: usize = 4 << 10;

type Fault = wasmtime::Error;

/// wasmtime's [`StoreLimits`] (memory, one instance, one table, one memory, bounded table
/// elements), remembering a refused memory growth so that the run's end is reported as a memory
/// overrun, not as the trap the applet's allocator turned it into.
pub(crate) struct Limiter {
    limits: StoreLimits,
    pub memory_denied: bool,
}

impl Limiter {
    fn new(memory_max: usize) -> Self {
        Limiter {
            limits: StoreLimitsBuilder::new()
                .memory_size(memory_max)
                .table_elements(100_000)
                .instances(1)
                .tables(1)
                .memories(1)
                .build(),
            memory_denied: false,
        }
    }
}

impl ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let allowed = self.limits.memory_growing(current, desired, maximum)?;
        if !allowed {
            self.memory_denied = true;
        }
        Ok(allowed)
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        self.limits.table_growing(current, desired, maximum)
    }

    fn instances(&self) -> usize {
        self.limits.instances()
    }

    fn tables(&self) -> usize {
        self.limits.tables()
    }

    fn memories(&self) -> usize {
        self.limits.memories()
    }
}

/// The response being built.
#[derive(Debug)]
pub(crate) struct Output {
    status: StatusCode,
    headers: Vec<(HeaderName, HeaderValue)>,
    parts: Vec<Bytes>,
    len: u64,
}

impl Output {
    fn new() -> Self {
        Output {
            status: StatusCode::OK,
            headers: Vec::new(),
            parts: Vec::new(),
            len: 0,
        }
    }

    /// The response.
    pub fn finish(self) -> Built {
        Built {
            status: self.status,
            headers: self.headers,
            parts: self.parts,
        }
    }
}

/// What a finished run produced, out of its state.
pub(crate) struct Ended {
    /// The origin's store, if the run has writes for it.
    pub kv: Option<Arc<Mutex<KvStore>>>,
    /// Where its log records go, if it has any.
    pub log_to: Option<Arc<str>>,
    pub output: Option<Output>,
    pub kv_writes: KvWrites,
    pub log: Vec<Bytes>,
}

/// The hit a state runs for. It stays with the state from one run to the next, so that a run
/// reuses the last one's URL buffer and, for the same document, its names of the origin and log
/// destination; between runs it holds neither request headers nor a document.
pub(crate) struct Current {
    pub method: Method,
    pub url: String,
    pub origin: Arc<str>,
    pub headers: HeaderMap,
    pub client: IpAddr,
    pub document: Option<Item>,
    pub log_to: Arc<str>,
}

/// Everything one run owns: its inputs, its bounds, what it built, what it wants to keep.
pub(crate) struct RunState {
    /// The hit being answered (read only while `live`), and where it opens items (kept
    /// between runs, like the hit's names).
    hit: Current,
    live: bool,
    items: Option<Arc<dyn Items>>,
    kv_stores: Arc<KvStores>,
    verified: Arc<VerifyMemo>,
    /// The store of an origin (`.0`), looked up on a run's first store access and kept while
    /// the runs are for that origin (stores are never dropped, so a kept one stays current).
    kv: Option<(Arc<str>, Arc<Mutex<KvStore>>)>,
    pub limiter: Limiter,
    pub memory: Option<Memory>,
    open: Vec<Item>,
    pub output: Option<Output>,
    pub output_overrun: bool,
    max_output: u64,
    copy_left: u64,
    max_copy: u64,
    pub kv_writes: KvWrites,
    kv_max: u64,
    pub log: Vec<Bytes>,
    log_left: u64,
    log_per_run: u64,
    /// Pages of the applet's memory written in the run ([`crate::rewind::pages`]): by the host,
    /// and by the applet once its run returns.
    dirty: u64,
    /// The searcher of the last `item_find` needle. It depends on the needle alone, so it is
    /// kept across runs: an applet searching for the same marker on every hit builds it once.
    finder: Option<memchr::memmem::Finder<'static>>,
}

impl RunState {
    pub fn new(kv_stores: Arc<KvStores>, verified: Arc<VerifyMemo>, config: &AppletConfig) -> Self {
        let none: Arc<str> = Arc::from("");
        RunState {
            hit: Current {
                method: Method::GET,
                url: String::new(),
                origin: none.clone(),
                headers: HeaderMap::new(),
                client: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                document: None,
                log_to: none,
            },
            live: false,
            items: None,
            kv_stores,
            verified,
            kv: None,
            limiter: Limiter::new(config.memory as usize),
            memory: None,
            open: Vec::new(),
            output: None,
            output_overrun: false,
            max_output: config.max_output,
            copy_left: config.max_copy,
            max_copy: config.max_copy,
            kv_writes: KvWrites::new(),
            kv_max: config.kv_max,
            log: Vec::new(),
            log_left: config.log_per_run,
            log_per_run: config.log_per_run,
            dirty: 0,
            finder: None,
        }
    }

    /// Gives a state (new, or left by an earlier run and ended) the hit, and the run's bounds
    /// afresh. The hit's headers are moved in; what it returns is where [`end`](Self::end)
    /// puts them back.
    pub fn begin<'a>(&mut self, hit: Hit<'a>, items: &Arc<dyn Items>) -> &'a mut HeaderMap {
        let now = &mut self.hit;
        if !Arc::ptr_eq(&now.origin, hit.origin) {
            if self.kv.as_ref().is_some_and(|(o, _)| o != hit.origin) {
                self.kv = None;
            }
            now.origin = hit.origin.clone();
        }
        if !Arc::ptr_eq(&now.log_to, hit.log_to) {
            now.log_to = hit.log_to.clone();
        }
        now.method.clone_from(hit.method);
        now.url.clear();
        now.url.push_str(hit.url);
        std::mem::swap(&mut now.headers, hit.headers);
        now.client = hit.client;
        now.document = Some(hit.document);
        if !self.items.as_ref().is_some_and(|i| Arc::ptr_eq(i, items)) {
            self.items = Some(items.clone());
        }
        self.live = true;
        self.open.clear();
        self.output = None;
        self.output_overrun = false;
        self.limiter.memory_denied = false;
        self.copy_left = self.max_copy;
        self.kv_writes.clear();
        self.log.clear();
        self.log_left = self.log_per_run;
        hit.headers
    }

    /// Adds the pages the applet marked in its run to those the host wrote.
    pub fn mark(&mut self, pages: u64) {
        self.dirty |= pages;
    }

    /// The pages of the applet's memory written since the last call: by the host, and by the
    /// applet as its run reported them ([`mark`](Self::mark)).
    pub fn take_dirty(&mut self) -> u64 {
        std::mem::take(&mut self.dirty)
    }

    /// Takes what a finished run produced out of its state, puts the request's headers back
    /// where [`begin`](Self::begin) took them, and lets go of the document and of everything the
    /// run opened (the store itself may be released later).
    pub fn end(&mut self, headers: &mut HeaderMap) -> Ended {
        let kv = match self.kv_writes.is_empty() {
            true => None,
            false => self.kv(),
        };
        let log_to = (!self.log.is_empty()).then(|| self.hit.log_to.clone());
        let now = &mut self.hit;
        std::mem::swap(&mut now.headers, headers);
        now.document = None;
        if now.url.capacity() > KEEP_URL {
            now.url = String::new();
        }
        self.live = false;
        self.open.clear();
        Ended {
            kv,
            log_to,
            output: self.output.take(),
            kv_writes: std::mem::take(&mut self.kv_writes),
            log: std::mem::take(&mut self.log),
        }
    }

    /// The hit being answered; none outside a run.
    fn hit(&self) -> Option<&Current> {
        self.live.then_some(&self.hit)
    }

    /// The origin's store (none outside a run).
    fn kv(&mut self) -> Option<Arc<Mutex<KvStore>>> {
        if let Some((_, kv)) = &self.kv {
            return Some(kv.clone());
        }
        let origin = self.hit()?.origin.clone();
        let kv = self.kv_stores.of(&origin);
        self.kv = Some((origin, kv.clone()));
        Some(kv)
    }

    fn output(&mut self) -> &mut Output {
        self.output.get_or_insert_with(Output::new)
    }

    /// Counts bytes copied into the applet against the run's bound.
    fn charge_copy(&mut self, n: usize) -> Result<(), Fault> {
        match self.copy_left.checked_sub(n as u64) {
            Some(left) => {
                self.copy_left = left;
                Ok(())
            }
            None => Err(wasmtime::Error::msg(
                "the run copied more than applets.max_copy out of the proxy",
            )),
        }
    }

    /// Where `needle` first occurs at or after `from` in the body of item `handle`; -1 if
    /// nowhere, or if there is no such item.
    fn find(&mut self, handle: i32, from: i32, needle: &[u8]) -> i32 {
        use memchr::memmem::Finder;
        let kept = needle.len() <= MAX_KEPT_NEEDLE;
        if kept && self.finder.as_ref().is_none_or(|f| f.needle() != needle) {
            self.finder = Some(Finder::new(needle).into_owned());
        }
        let Some(body) = item(self, handle).map(|i| &i.body) else {
            return -1;
        };
        let from = from.max(0) as usize;
        if needle.is_empty() || from > body.len() {
            return -1;
        }
        let haystack = &body[from..];
        let at = match &self.finder {
            Some(f) if kept => f.find(haystack),
            _ => memchr::memmem::find(haystack, needle),
        };
        at.and_then(|at| i32::try_from(from + at).ok())
            .unwrap_or(-1)
    }

    /// Appends to the built body, or marks the overrun.
    fn append(&mut self, bytes: Bytes) -> i32 {
        let max = self.max_output;
        let out = self.output();
        if out.len + bytes.len() as u64 > max {
            self.output_overrun = true;
            return -1;
        }
        out.len += bytes.len() as u64;
        if !bytes.is_empty() {
            out.parts.push(bytes);
        }
        0
    }
}

fn memory(caller: &Caller<'_, RunState>) -> Result<Memory, Fault> {
    caller
        .data()
        .memory
        .ok_or_else(|| wasmtime::Error::msg("the applet's memory is not known yet"))
}

fn range(len: usize, ptr: i32, n: i32) -> Result<std::ops::Range<usize>, Fault> {
    let (p, n) = (ptr as u32 as usize, n as u32 as usize);
    match p.checked_add(n) {
        Some(end) if end <= len => Ok(p..end),
        _ => Err(wasmtime::Error::msg(format!(
            "pointer range {p}+{n} is outside the applet's memory ({len} bytes)"
        ))),
    }
}

/// Reads bytes the applet passed.
fn read(caller: &mut Caller<'_, RunState>, ptr: i32, n: i32) -> Result<Vec<u8>, Fault> {
    let mem = memory(caller)?;
    let data = mem.data(&*caller);
    Ok(data[range(data.len(), ptr, n)?].to_vec())
}

/// Copies `src` (at most `cap` bytes of it) to the applet; returns the full length.
fn give(caller: &mut Caller<'_, RunState>, src: &[u8], out: i32, cap: i32) -> Result<i32, Fault> {
    let mem = memory(caller)?;
    let (data, state) = mem.data_and_store_mut(&mut *caller);
    give_into(data, state, src, out, cap)
}

/// [`give`], given the applet's memory and the run's state.
fn give_into(
    data: &mut [u8],
    state: &mut RunState,
    src: &[u8],
    out: i32,
    cap: i32,
) -> Result<i32, Fault> {
    let n = src.len().min(cap.max(0) as usize);
    let r = range(data.len(), out, n as i32)?;
    state.charge_copy(n)?;
    state.dirty |= crate::rewind::pages(r.start as u64, n as u64);
    data[r].copy_from_slice(&src[..n]);
    Ok(i32::try_from(src.len()).unwrap_or(i32::MAX))
}

fn header_lines<'a>(headers: impl Iterator<Item = (&'a HeaderName, &'a HeaderValue)>) -> Vec<u8> {
    let mut s = Vec::new();
    for (n, v) in headers {
        s.extend_from_slice(n.as_str().as_bytes());
        s.extend_from_slice(b": ");
        s.extend_from_slice(v.as_bytes());
        s.push(b'\n');
    }
    s
}

fn input_bytes(inv: &Current, which: Input) -> Vec<u8> {
    match which {
        Input::Method => inv.method.as_str().as_bytes().to_vec(),
        Input::Url => inv.url.as_bytes().to_vec(),
        Input::RequestHeaders => header_lines(inv.headers.iter()),
        Input::ClientAddr => inv.client.to_string().into_bytes(),
        Input::Status => match &inv.document {
            Some(d) => d.status.as_str().as_bytes().to_vec(),
            None => Vec::new(),
        },
        Input::DocumentHeaders => match &inv.document {
            Some(d) => header_lines(d.headers.iter().map(|(n, v)| (n, v))),
            None => Vec::new(),
        },
    }
}

/// Values of a header, `, `-joined (a single value is not copied); `None` if absent.
fn joined<'a>(
    headers: impl Iterator<Item = (&'a HeaderName, &'a HeaderValue)>,
    name: &[u8],
) -> Option<Cow<'a, [u8]>> {
    let name = HeaderName::from_bytes(name).ok()?;
    let mut out: Option<Cow<'a, [u8]>> = None;
    for (_, v) in headers.filter(|(n, _)| **n == name) {
        match &mut out {
            Some(o) => {
                let o = o.to_mut();
                o.extend_from_slice(b", ");
                o.extend_from_slice(v.as_bytes());
            }
            None => out = Some(Cow::Borrowed(v.as_bytes())),
        }
    }
    out
}

/// Resolves an item reference to an absolute URL of the document's origin, or `None`.
fn same_origin(origin: &str, reference: &str) -> Option<String> {
    if reference.starts_with('/') && !reference.starts_with("//") {
        return Some(format!("{origin}{reference}"));
    }
    let rest = reference.strip_prefix(origin)?;
    (rest.is_empty() || rest.starts_with('/')).then(|| {
        if rest.is_empty() {
            format!("{origin}/")
        } else {
            reference.to_owned()
        }
    })
}

fn item(state: &RunState, handle: i32) -> Option<&Item> {
    match usize::try_from(handle).ok()? {
        0 => state.hit()?.document.as_ref(),
        h => state.open.get(h - 1),
    }
}

/// Defines every import of the interface ([`abi`]'s table) in `linker`.
pub(crate) fn define(linker: &mut Linker<RunState>) -> wasmtime::Result<()> {
    let m = abi::MODULE;
    linker.func_wrap(
        m,
        "input",
        |mut c: Caller<'_, RunState>, which: i32, out: i32, cap: i32| -> wasmtime::Result<i32> {
            let (Some(which), Some(inv)) = (Input::from_code(which), c.data().hit()) else {
                return Ok(-1);
            };
            let bytes = input_bytes(inv, which);
            give(&mut c, &bytes, out, cap)
        },
    )?;
    linker.func_wrap(
        m,
        "request_header",
        |mut c: Caller<'_, RunState>, name: i32, len: i32, out: i32, cap: i32| {
            // The name is read in place, and a single value copied straight to the applet.
            let mem = memory(&c)?;
            let (data, state) = mem.data_and_store_mut(&mut c);
            let name = &data[range(data.len(), name, len)?];
            if !state.live {
                return Ok(-1);
            }
            // Out of the state while the value is copied (a move, not a copy), and back
            // whatever the copy's outcome: the request gets them back at the run's end.
            let headers = std::mem::take(&mut state.hit.headers);
            let given = match joined(headers.iter(), name) {
                Some(v) => give_into(data, state, &v, out, cap),
                None => Ok(-1),
            };
            state.hit.headers = headers;
            given
        },
    )?;
    linker.func_wrap(m, "now_ms", |_: Caller<'_, RunState>| -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64)
    })?;
    linker.func_wrap(
        m,
        "item_open",
        |mut c: Caller<'_, RunState>, url: i32, len: i32| -> wasmtime::Result<i32> {
            let url = read(&mut c, url, len)?;
            let state = c.data_mut();
            if state.open.len() + 1 >= MAX_OPEN {
                return Ok(-1);
            }
            let Ok(url) = std::str::from_utf8(&url) else {
                return Ok(-1);
            };
            let (Some(inv), Some(items)) = (state.hit(), &state.items) else {
                return Ok(-1);
            };
            let Some(abs) = same_origin(&inv.origin, url) else {
                return Ok(-1);
            };
            match items.open(&abs, &inv.headers) {
                Some(item) => {
                    state.open.push(item);
                    Ok(state.open.len() as i32)
                }
                None => Ok(-1),
            }
        },
    )?;
    linker.func_wrap(m, "item_len", |c: Caller<'_, RunState>, h: i32| -> i32 {
        item(c.data(), h).map_or(-1, |i| i32::try_from(i.body.len()).unwrap_or(i32::MAX))
    })?;
    linker.func_wrap(
        m,
        "item_read",
        |mut c: Caller<'_, RunState>, h: i32, offset: i32, out: i32, cap: i32| {
            let Some(body) = item(c.data(), h).map(|i| i.body.clone()) else {
                return Ok(-1);
            };
            let start = (offset.max(0) as usize).min(body.len());
            let n = (body.len() - start).min(cap.max(0) as usize);
            give(&mut c, &body[start..start + n], out, n as i32).map(|_| n as i32)
        },
    )?;
    linker.func_wrap(
        m,
        "item_header",
        |mut c: Caller<'_, RunState>, h: i32, name: i32, len: i32, out: i32, cap: i32| {
            let mem = memory(&c)?;
            let (data, state) = mem.data_and_store_mut(&mut c);
            let name = &data[range(data.len(), name, len)?];
            let Some(headers) = item(state, h).map(|i| i.headers.clone()) else {
                return Ok(-1);
            };
            match joined(headers.iter().map(|(n, v)| (n, v)), name) {
                Some(v) => give_into(data, state, &v, out, cap),
                None => Ok(-1),
            }
        },
    )?;
    linker.func_wrap(
        m,
        "item_find",
        |mut c: Caller<'_, RunState>, h: i32, from: i32, needle: i32, len: i32| {
            // The needle is read in place: no copy of it is made.
            let mem = memory(&c)?;
            let (data, state) = mem.data_and_store_mut(&mut c);
            let needle = &data[range(data.len(), needle, len)?];
            Ok(state.find(h, from, needle))
        },
    )?;
    linker.func_wrap(m, "set_status", |mut c: Caller<'_, RunState>, code: i32| {
        let code = u16::try_from(code).ok().filter(|c| (200..=599).contains(c));
        match code.and_then(|s| StatusCode::from_u16(s).ok()) {
            Some(s) => {
                c.data_mut().output().status = s;
                0
            }
            None => -1,
        }
    })?;
    linker.func_wrap(
        m,
        "add_header",
        |mut c: Caller<'_, RunState>, n: i32, nl: i32, v: i32, vl: i32| {
            if nl.max(0) as usize + vl.max(0) as usize > MAX_HEADER_BYTES {
                return Ok(-1);
            }
            let name = read(&mut c, n, nl)?;
            let value = read(&mut c, v, vl)?;
            let out = c.data_mut().output();
            if out.headers.len() >= MAX_HEADERS {
                return Ok(-1);
            }
            match (
                HeaderName::from_bytes(&name),
                HeaderValue::from_bytes(&value),
            ) {
                (Ok(n), Ok(v)) if !hop_by_hop(&n) => {
                    out.headers.push((n, v));
                    Ok(0)
                }
                _ => Ok(-1),
            }
        },
    )?;
    linker.func_wrap(
        m,
        "write",
        |mut c: Caller<'_, RunState>, ptr: i32, len: i32| -> wasmtime::Result<i32> {
            let state = c.data();
            if state.output.as_ref().map_or(0, |o| o.len) + len.max(0) as u64 > state.max_output {
                c.data_mut().output_overrun = true;
                return Ok(-1);
            }
            let bytes = read(&mut c, ptr, len)?;
            Ok(c.data_mut().append(Bytes::from(bytes)))
        },
    )?;
    linker.func_wrap(
        m,
        "write_item",
        |mut c: Caller<'_, RunState>, h: i32, offset: i32, len: i32| {
            let state = c.data_mut();
            let Some(body) = item(state, h).map(|i| i.body.clone()) else {
                return -1;
            };
            let (start, n) = (offset.max(0) as usize, len.max(0) as usize);
            match start.checked_add(n) {
                Some(end) if end <= body.len() => state.append(body.slice(start..end)),
                _ => -1,
            }
        },
    )?;
    linker.func_wrap(
        m,
        "kv_get",
        |mut c: Caller<'_, RunState>, k: i32, kl: i32, out: i32, cap: i32| {
            let key = read(&mut c, k, kl)?;
            let state = c.data_mut();
            let value = match state.kv_writes.get(&key) {
                Some(pending) => pending.clone(),
                None => state
                    .kv()
                    .and_then(|kv| kv.lock().get(&key).map(<[u8]>::to_vec)),
            };
            match value {
                Some(v) => give(&mut c, &v, out, cap),
                None => Ok(-1),
            }
        },
    )?;
    linker.func_wrap(
        m,
        "kv_put",
        |mut c: Caller<'_, RunState>, k: i32, kl: i32, v: i32, vl: i32| {
            if kl.max(0) as usize > MAX_KEY || vl.max(0) as u64 > c.data().kv_max {
                return Ok(-1);
            }
            let key = read(&mut c, k, kl)?;
            let value = read(&mut c, v, vl)?;
            let state = c.data_mut();
            let Some(kv) = state.kv() else {
                return Ok(-1);
            };
            let previous = state.kv_writes.insert(key.clone(), Some(value));
            if kv.lock().bytes_after(&state.kv_writes) > state.kv_max {
                match previous {
                    Some(p) => state.kv_writes.insert(key, p),
                    None => state.kv_writes.remove(&key),
                };
                return Ok(-1);
            }
            Ok(0)
        },
    )?;
    linker.func_wrap(
        m,
        "kv_delete",
        |mut c: Caller<'_, RunState>, k: i32, kl: i32| -> wasmtime::Result<i32> {
            let key = read(&mut c, k, kl)?;
            c.data_mut().kv_writes.insert(key, None);
            Ok(0)
        },
    )?;
    linker.func_wrap(
        m,
        "log",
        |mut c: Caller<'_, RunState>, ptr: i32, len: i32| -> wasmtime::Result<i32> {
            if len.max(0) as u64 > c.data().log_left {
                return Ok(-1);
            }
            let record = read(&mut c, ptr, len)?;
            let state = c.data_mut();
            state.log_left -= record.len() as u64;
            state.log.push(Bytes::from(record));
            Ok(0)
        },
    )?;
    linker.func_wrap(
        m,
        "ed25519_verify",
        |mut c: Caller<'_, RunState>, pk: i32, sig: i32, msg: i32, len: i32| {
            // Checked in place: nothing is copied out of the applet.
            let mem = memory(&c)?;
            let (data, state) = mem.data_and_store_mut(&mut c);
            let pk = &data[range(data.len(), pk, 32)?];
            let sig = &data[range(data.len(), sig, 64)?];
            let msg = &data[range(data.len(), msg, len)?];
            Ok(i32::from(state.verified.verify(pk, sig, msg)))
        },
    )?;
    Ok(())
}

/// Results of recent signature checks. A check is a pure function of (key, signature,
/// message), so a remembered result is exact: each is kept under its signature with the key
/// and message it was checked with, and used only when both are the same bytes again. It saves
/// the ~50 µs of curve arithmetic when the same token comes back on every request of a
/// session. Bounded: [`VERIFY_MEMO`] results (emptied when full), of messages of at most
/// [`VERIFY_MEMO_MSG`] bytes (longer ones are checked every time).
#[derive(Debug, Default)]
pub(crate) struct VerifyMemo {
    results: Mutex<std::collections::HashMap<[u8; 64], Checked>>,
}

#[derive(Debug)]
struct Checked {
    key: [u8; 32],
    msg: Box<[u8]>,
    ok: bool,
}

/// The most results remembered.
const VERIFY_MEMO: usize = 4096;
/// The longest message whose result is remembered.
const VERIFY_MEMO_MSG: usize = 1024;

impl VerifyMemo {
    pub fn verify(&self, public_key: &[u8], signature: &[u8], msg: &[u8]) -> bool {
        let (Ok(key), Ok(sig)) = (
            <[u8; 32]>::try_from(public_key),
            <[u8; 64]>::try_from(signature),
        ) else {
            return false;
        };
        let remember = msg.len() <= VERIFY_MEMO_MSG;
        if remember {
            if let Some(c) = self.results.lock().get(&sig) {
                if c.key == key && *c.msg == *msg {
                    return c.ok;
                }
            }
        }
        let ok = verify(public_key, signature, msg);
        if remember {
            let mut results = self.results.lock();
            if results.len() >= VERIFY_MEMO && !results.contains_key(&sig) {
                results.clear();
            }
            results.insert(
                sig,
                Checked {
                    key,
                    msg: msg.into(),
                    ok,
                },
            );
        }
        ok
    }
}

/// Ed25519 (RFC 8032) verification, strict (rejects non-canonical and small-order keys).
pub(crate) fn verify(public_key: &[u8], signature: &[u8], msg: &[u8]) -> bool {
    let (Ok(pk), Ok(sig)) = (
        <[u8; 32]>::try_from(public_key),
        <[u8; 64]>::try_from(signature),
    ) else {
        return false;
    };
    let Ok(key) = ed25519_dalek::VerifyingKey::from_bytes(&pk) else {
        return false;
    };
    key.verify_strict(msg, &ed25519_dalek::Signature::from_bytes(&sig))
        .is_ok()
}

/// Headers a built response may not set: the proxy owns the connection and the framing.
fn hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "content-length"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn item_references_stay_in_the_origin() {
        let o = "http://a.example:8080";
        assert_eq!(same_origin(o, "/x"), Some(format!("{o}/x")));
        assert_eq!(
            same_origin(o, "http://a.example:8080/y").as_deref(),
            Some("http://a.example:8080/y")
        );
        assert_eq!(
            same_origin(o, "http://a.example:8080").as_deref(),
            Some("http://a.example:8080/")
        );
        assert_eq!(same_origin(o, "http://a.example:80801/y"), None);
        assert_eq!(same_origin(o, "http://a.example/y"), None);
        assert_eq!(same_origin(o, "//b.example/y"), None);
        assert_eq!(same_origin(o, "y"), None);
    }

    fn state_over(body: &'static [u8]) -> RunState {
        struct Nothing;
        impl Items for Nothing {
            fn open(&self, _url: &str, _request: &http::HeaderMap) -> Option<Item> {
                None
            }
        }
        let mut state = RunState::new(Arc::default(), Arc::default(), &AppletConfig::default());
        let hit = Hit {
            method: &http::Method::GET,
            url: "http://o.test/doc",
            origin: &Arc::from("http://o.test"),
            headers: &mut http::HeaderMap::new(),
            client: std::net::IpAddr::from([127, 0, 0, 1]),
            document: Item {
                status: StatusCode::OK,
                headers: Arc::from(Vec::new()),
                body: Bytes::from_static(body),
            },
            log_to: &Arc::from("http://o.test/log"),
        };
        let items: Arc<dyn Items> = Arc::new(Nothing);
        state.begin(hit, &items);
        state
    }

    proptest::proptest! {
        /// The kept searcher answers as a fresh search would, whatever was searched before:
        /// needles short and long (past the kept bound), repeated or not, any start.
        #[test]
        fn finds_agree_with_a_plain_search(
            searches in proptest::collection::vec(
                (proptest::collection::vec(proptest::sample::select(b"ab<!-".to_vec()), 0..4),
                 0usize..3, -2i32..400, 0i32..2),
                1..24),
        ) {
            let body: &'static [u8] = Box::leak(
                b"<!--a--><!-ab<!--".repeat(20).into_boxed_slice());
            let mut state = state_over(body);
            let long = body[..300].to_vec();
            for (short, kind, from, handle) in searches {
                let needle = match kind {
                    0 => short,
                    1 => long.clone(),
                    _ => b"<!--".to_vec(),
                };
                let expected = if handle != 0 || needle.is_empty() || from.max(0) as usize > body.len() {
                    -1
                } else {
                    let from = from.max(0) as usize;
                    body[from..]
                        .windows(needle.len())
                        .position(|w| w == &needle[..])
                        .map_or(-1, |at| (from + at) as i32)
                };
                proptest::prop_assert_eq!(state.find(handle, from, &needle), expected);
            }
        }
    }

    #[test]
    fn ranges_reject_overflow_and_negative_lengths() {
        assert_eq!(range(10, 2, 3).ok(), Some(2..5));
        assert!(range(10, 8, 3).is_err());
        assert!(range(10, -1, 1).is_err());
        assert!(range(10, 0, -1).is_err());
        assert_eq!(range(10, 10, 0).ok(), Some(10..10));
    }
}
