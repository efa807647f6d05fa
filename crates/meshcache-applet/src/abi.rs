//! The applet interface, declared once: what a module imports from the proxy and exports to it.
//!
//! An applet is a core WebAssembly module. It exports its linear `memory` and one entry point,
//! [`ENTRY`] (`run: () -> i32`), whose result is an [`Outcome`] code. Everything else it
//! learns or does goes through the functions below, imported from the module [`MODULE`]
//! (`"meshcache"`). Pointers and lengths are `i32` offsets into the applet's memory; a pointer
//! range outside that memory traps. Functions that return data follow one convention: they
//! copy at most `cap` bytes to `out` and return the *full* length (or `-1` for "absent"), so a
//! caller whose buffer was too small learns the size and asks again.
//!
//! The host also links nothing else: no WASI, no clock, no file, no socket. An import the
//! table does not list makes the module fail to link ([`crate::AppletError::Link`]).
//!
//! | import | signature | what it does |
//! | --- | --- | --- |
//! | `input` | `(which, out, cap) -> len` | a request or document field, see [`Input`] |
//! | `request_header` | `(name, name_len, out, cap) -> len \| -1` | request header values (`, `-joined) |
//! | `now_ms` | `() -> i64` | wall-clock time, Unix milliseconds |
//! | `item_open` | `(url, url_len) -> handle \| -1` | a fresh cached object of the same origin; handle 0 is the document |
//! | `item_len` | `(handle) -> len \| -1` | body length |
//! | `item_read` | `(handle, offset, out, cap) -> n \| -1` | copies body bytes from `offset`; returns the count copied |
//! | `item_header` | `(handle, name, name_len, out, cap) -> len \| -1` | a stored response header |
//! | `item_find` | `(handle, from, needle, needle_len) -> offset \| -1` | first occurrence of a byte string in a body at or after `from`, searched in place |
//! | `set_status` | `(code) -> 0 \| -1` | status of the built response (200–599; default 200) |
//! | `add_header` | `(name, name_len, value, value_len) -> 0 \| -1` | a header of the built response |
//! | `write` | `(ptr, len) -> 0 \| -1` | appends bytes to the built body |
//! | `write_item` | `(handle, offset, len) -> 0 \| -1` | appends a range of a cached body, no copy through the applet |
//! | `kv_get` | `(key, key_len, out, cap) -> len \| -1` | the origin's store, as this run sees it |
//! | `kv_put` | `(key, key_len, value, value_len) -> 0 \| -1` | a write, committed only if the run completes |
//! | `kv_delete` | `(key, key_len) -> 0` | a delete, committed likewise |
//! | `log` | `(ptr, len) -> 0 \| -1` | appends a record to the log object sent to the origin |
//! | `ed25519_verify` | `(public_key, signature, msg, msg_len) -> 1 \| 0` | RFC 8032 signature check (32-byte key, 64-byte signature) |
//!
//! `-1` from a writing function means a bound was reached (the bounds of [`crate::AppletConfig`]); the run may go
//! on, but what it asked for did not happen. Overrunning the output bound also ends the run's
//! chance to serve a built response: its outcome becomes "to the origin".

/// The import module name.
pub const MODULE: &str = "meshcache";
/// The exported entry point: `run() -> i32`.
pub const ENTRY: &str = "run";
/// The exported memory.
pub const MEMORY: &str = "memory";

/// What `run` returned, decoded. Any other value, a trap or a limit means [`Outcome::Origin`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// 0: serve the cached copy.
    Cached,
    /// 1: serve the response the applet built (`set_status`, `add_header`, `write`).
    Built,
    /// 2: send the request to the origin, handled as a miss.
    Origin,
}

impl Outcome {
    /// Decodes the entry point's result; `None` for a value outside the contract.
    pub fn from_code(code: i32) -> Option<Self> {
        match code {
            0 => Some(Self::Cached),
            1 => Some(Self::Built),
            2 => Some(Self::Origin),
            _ => None,
        }
    }

    /// The code an applet returns for this outcome.
    #[cfg(test)]
    pub fn code(self) -> i32 {
        match self {
            Self::Cached => 0,
            Self::Built => 1,
            Self::Origin => 2,
        }
    }
}

/// Selectors of `input(which, out, cap)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum Input {
    /// 0: the request method.
    Method = 0,
    /// 1: the absolute request URL.
    Url = 1,
    /// 2: all request headers, one `name: value\n` line each, names lower-case.
    RequestHeaders = 2,
    /// 3: the client's IP address, as text.
    ClientAddr = 3,
    /// 4: the cached document's status code, as decimal text.
    Status = 4,
    /// 5: the cached document's headers, one `name: value\n` line each.
    DocumentHeaders = 5,
}

impl Input {
    /// Decodes a selector.
    pub fn from_code(code: i32) -> Option<Self> {
        Some(match code {
            0 => Self::Method,
            1 => Self::Url,
            2 => Self::RequestHeaders,
            3 => Self::ClientAddr,
            4 => Self::Status,
            5 => Self::DocumentHeaders,
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcome_codes_round_trip() {
        for o in [Outcome::Cached, Outcome::Built, Outcome::Origin] {
            assert_eq!(Outcome::from_code(o.code()), Some(o));
        }
        assert_eq!(Outcome::from_code(3), None);
        assert_eq!(Outcome::from_code(-1), None);
    }

    #[test]
    fn input_selectors_round_trip() {
        for i in 0..6 {
            assert_eq!(Input::from_code(i).map(|s| s as i32), Some(i));
        }
        assert_eq!(Input::from_code(6), None);
    }
}
