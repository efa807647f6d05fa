//! The host functions of [`crate::abi`]: what a run may read, build and keep, each bounded.
//!
//! A function given a pointer range outside the applet's memory traps the run. A function that
//! would pass a bound returns `-1` and does nothing; passing the output bound also marks the run
//! so its result cannot be served.

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, StatusCode};
use parking_lot::Mutex;
use wasmtime::{Caller, Linker, Memory, ResourceLimiter, StoreLimits, StoreLimitsBuilder};

use crate::abi::{self, Input};
use crate::config::AppletConfig;
use crate::runtime::{Built, Invocation, Item, Items};
use crate::state::{KvStore, KvStores, KvWrites, MAX_KEY};

/// The most objects one run may open (the document included).
const MAX_OPEN: usize = 64;
/// The most headers a built response may carry.
const MAX_HEADERS: usize = 64;
/// The longest header (name plus value) a built response may carry.
const MAX_HEADER_BYTES: usize = 8 << 10;

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
    pub inv: Invocation,
    pub output: Option<Output>,
    pub kv_writes: KvWrites,
    pub log: Vec<Bytes>,
}

/// Everything one run owns: its inputs, its bounds, what it built, what it wants to keep.
pub(crate) struct RunState {
    pub inv: Invocation,
    items: Arc<dyn Items>,
    kv_stores: Arc<KvStores>,
    verified: Arc<VerifyMemo>,
    /// The origin's store, looked up on the run's first store access.
    kv: Option<Arc<Mutex<KvStore>>>,
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
    /// Pages of the applet's memory the host wrote ([`crate::rewind::pages`]).
    dirty: u64,
}

impl RunState {
    pub fn new(
        inv: Invocation,
        items: Arc<dyn Items>,
        kv_stores: Arc<KvStores>,
        verified: Arc<VerifyMemo>,
        config: &AppletConfig,
    ) -> Self {
        RunState {
            inv,
            items,
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
        }
    }

    /// Gives a state kept ready (made ahead with a placeholder invocation, or left by an
    /// earlier run and ended) the hit's invocation, and the run's bounds afresh.
    pub fn begin(&mut self, inv: Invocation, items: Arc<dyn Items>) {
        self.inv = inv;
        self.items = items;
        self.kv = None;
        self.open.clear();
        self.output = None;
        self.output_overrun = false;
        self.limiter.memory_denied = false;
        self.copy_left = self.max_copy;
        self.kv_writes.clear();
        self.log.clear();
        self.log_left = self.log_per_run;
    }

    /// The pages of the applet's memory the host wrote since the last call.
    pub fn take_dirty(&mut self) -> u64 {
        std::mem::take(&mut self.dirty)
    }

    /// Takes what a finished run produced out of its state, and lets go of the invocation and
    /// of everything it opened (the caller may want the request's headers back at once; the
    /// store itself may be released later).
    pub fn end(&mut self, idle: &Invocation, no_items: &Arc<dyn Items>) -> Ended {
        self.items = no_items.clone();
        self.kv = None;
        self.open.clear();
        Ended {
            inv: std::mem::replace(&mut self.inv, idle.clone()),
            output: self.output.take(),
            kv_writes: std::mem::take(&mut self.kv_writes),
            log: std::mem::take(&mut self.log),
        }
    }

    /// The origin's store.
    fn kv(&mut self) -> Arc<Mutex<KvStore>> {
        match &self.kv {
            Some(kv) => kv.clone(),
            None => {
                let kv = self.kv_stores.of(&self.inv.origin);
                self.kv = Some(kv.clone());
                kv
            }
        }
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
    let n = src.len().min(cap.max(0) as usize);
    let mem = memory(caller)?;
    let (data, state) = mem.data_and_store_mut(&mut *caller);
    let r = range(data.len(), out, n as i32)?;
    state.charge_copy(n)?;
    state.dirty |= crate::rewind::pages(r.start as u64, n as u64);
    data[r].copy_from_slice(&src[..n]);
    Ok(i32::try_from(src.len()).unwrap_or(i32::MAX))
}

fn header_lines(headers: impl Iterator<Item = (String, Vec<u8>)>) -> Vec<u8> {
    let mut s = Vec::new();
    for (n, v) in headers {
        s.extend_from_slice(n.as_bytes());
        s.extend_from_slice(b": ");
        s.extend_from_slice(&v);
        s.push(b'\n');
    }
    s
}

fn input_bytes(state: &RunState, which: Input) -> Vec<u8> {
    let inv = &state.inv;
    match which {
        Input::Method => inv.method.as_str().as_bytes().to_vec(),
        Input::Url => inv.url.as_bytes().to_vec(),
        Input::RequestHeaders => header_lines(
            inv.headers
                .iter()
                .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec())),
        ),
        Input::ClientAddr => inv.client.to_string().into_bytes(),
        Input::Status => inv.document.status.as_str().as_bytes().to_vec(),
        Input::DocumentHeaders => header_lines(
            inv.document
                .headers
                .iter()
                .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec())),
        ),
    }
}

/// Values of a header, `, `-joined; `None` if absent.
fn joined<'a>(
    headers: impl Iterator<Item = (&'a HeaderName, &'a HeaderValue)>,
    name: &[u8],
) -> Option<Vec<u8>> {
    let name = HeaderName::from_bytes(name).ok()?;
    let mut out: Option<Vec<u8>> = None;
    for (_, v) in headers.filter(|(n, _)| **n == name) {
        match &mut out {
            Some(o) => {
                o.extend_from_slice(b", ");
                o.extend_from_slice(v.as_bytes());
            }
            None => out = Some(v.as_bytes().to_vec()),
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
        0 => Some(&state.inv.document),
        h => state.open.get(h - 1),
    }
}

/// Defines every import of [`abi::IMPORTS`] in `linker`.
pub(crate) fn define(linker: &mut Linker<RunState>) -> wasmtime::Result<()> {
    let m = abi::MODULE;
    linker.func_wrap(
        m,
        "input",
        |mut c: Caller<'_, RunState>, which: i32, out: i32, cap: i32| -> wasmtime::Result<i32> {
            let Some(which) = Input::from_code(which) else {
                return Ok(-1);
            };
            let bytes = input_bytes(c.data(), which);
            give(&mut c, &bytes, out, cap)
        },
    )?;
    linker.func_wrap(
        m,
        "request_header",
        |mut c: Caller<'_, RunState>, name: i32, len: i32, out: i32, cap: i32| {
            let name = read(&mut c, name, len)?;
            match joined(c.data().inv.headers.iter(), &name) {
                Some(v) => give(&mut c, &v, out, cap),
                None => Ok(-1),
            }
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
            let Some(abs) = same_origin(&state.inv.origin, url) else {
                return Ok(-1);
            };
            match state.items.open(&abs) {
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
            let name = read(&mut c, name, len)?;
            let Some(value) = item(c.data(), h)
                .and_then(|i| joined(i.headers.iter().map(|(n, v)| (n, v)), &name))
            else {
                return Ok(-1);
            };
            give(&mut c, &value, out, cap)
        },
    )?;
    linker.func_wrap(
        m,
        "item_find",
        |mut c: Caller<'_, RunState>, h: i32, from: i32, needle: i32, len: i32| {
            let needle = read(&mut c, needle, len)?;
            let Some(body) = item(c.data(), h).map(|i| i.body.clone()) else {
                return Ok(-1);
            };
            let from = from.max(0) as usize;
            if needle.is_empty() || from > body.len() {
                return Ok(-1);
            }
            Ok(memchr::memmem::find(&body[from..], &needle)
                .and_then(|at| i32::try_from(from + at).ok())
                .unwrap_or(-1))
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
                None => state.kv().lock().get(&key).map(<[u8]>::to_vec),
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
            let previous = state.kv_writes.insert(key.clone(), Some(value));
            if state.kv().lock().bytes_after(&state.kv_writes) > state.kv_max {
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
            let pk = read(&mut c, pk, 32)?;
            let sig = read(&mut c, sig, 64)?;
            let msg = read(&mut c, msg, len)?;
            Ok(i32::from(c.data().verified.verify(&pk, &sig, &msg)))
        },
    )?;
    Ok(())
}

/// Results of recent signature checks. A check is a pure function of (key, signature,
/// message), so a remembered result is exact; it saves the ~50 µs of curve arithmetic when the
/// same token comes back on every request of a session. Keyed by SHA-256 of the three inputs;
/// bounded (emptied when full).
#[derive(Debug, Default)]
pub(crate) struct VerifyMemo {
    results: Mutex<std::collections::HashMap<[u8; 32], bool>>,
}

/// The most results remembered.
const VERIFY_MEMO: usize = 4096;

impl VerifyMemo {
    pub fn verify(&self, public_key: &[u8], signature: &[u8], msg: &[u8]) -> bool {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        h.update(public_key);
        h.update(signature);
        h.update((msg.len() as u64).to_le_bytes());
        h.update(msg);
        let key: [u8; 32] = h.finalize().into();
        if let Some(ok) = self.results.lock().get(&key) {
            return *ok;
        }
        let ok = verify(public_key, signature, msg);
        let mut results = self.results.lock();
        if results.len() >= VERIFY_MEMO {
            results.clear();
        }
        results.insert(key, ok);
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

    #[test]
    fn ranges_reject_overflow_and_negative_lengths() {
        assert_eq!(range(10, 2, 3).ok(), Some(2..5));
        assert!(range(10, 8, 3).is_err());
        assert!(range(10, -1, 1).is_err());
        assert!(range(10, 0, -1).is_err());
        assert_eq!(range(10, 10, 0).ok(), Some(10..10));
    }
}
