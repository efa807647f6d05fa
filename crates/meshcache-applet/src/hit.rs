//! A hit as an applet sees it: the request ([`Invocation`], or [`Hit`] lent by a caller that
//! keeps it), the stored responses it may read ([`Item`], and others through [`Items`]), and
//! the response it builds ([`Built`]). The runtime carries them through a run; the host
//! functions read and fill them.

use std::net::IpAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};

/// Stored response headers, in order, shared with the cache (no copy per run).
pub type Headers = Arc<[(HeaderName, HeaderValue)]>;

/// A cached object as an applet sees it.
#[derive(Clone, Debug)]
pub struct Item {
    /// Response status.
    pub status: StatusCode,
    /// Stored response headers.
    pub headers: Headers,
    /// The body.
    pub body: Bytes,
}

/// Where `item_open` finds other cached objects: the proxy's cache, fresh entries only.
pub trait Items: Send + Sync {
    /// The fresh cached object stored under this absolute URL, if any, for a request with
    /// these headers (they choose among `Vary` variants, and their cache directives apply).
    fn open(&self, url: &str, request: &HeaderMap) -> Option<Item>;
}

/// One hit to run an applet for: what the origin would have seen, and the stored document
/// (owned; [`Hit`] is the same lent by a caller who keeps it).
#[derive(Clone, Debug)]
pub struct Invocation {
    /// Request method.
    pub method: Method,
    /// Absolute request URL.
    pub url: String,
    /// The document's origin, `http://host[:port]` (the applet's sandbox).
    pub origin: Arc<str>,
    /// Request headers as the client sent them (cookies included).
    pub headers: HeaderMap,
    /// Client address.
    pub client: IpAddr,
    /// The cached document.
    pub document: Item,
    /// Where the run's log records go.
    pub log_to: Arc<str>,
}

/// One hit to run an applet for, as [`Invocation`], lent by a caller who still needs the
/// request: the run borrows the headers (moved in and put back, never copied) and copies the
/// URL into a buffer its instance keeps. The origin's and log destination's names are cloned
/// only when they differ from the last run's in the same instance, so the hits of one
/// document touch no shared reference count for them.
#[derive(Debug)]
pub struct Hit<'a> {
    /// Request method.
    pub method: &'a Method,
    /// Absolute request URL.
    pub url: &'a str,
    /// The document's origin, `http://host[:port]` (the applet's sandbox).
    pub origin: &'a Arc<str>,
    /// Request headers as the client sent them (cookies included); as they were when the
    /// run returns.
    pub headers: &'a mut HeaderMap,
    /// Client address.
    pub client: IpAddr,
    /// The cached document.
    pub document: Item,
    /// Where the run's log records go.
    pub log_to: &'a Arc<str>,
}

impl Invocation {
    /// This invocation as a [`Hit`] for `Runtime::run_deferred`: borrowed, with the document
    /// shared (its headers and body are reference-counted). The headers are back in `self` when
    /// the run returns.
    #[inline]
    pub fn lend(&mut self) -> Hit<'_> {
        Hit {
            method: &self.method,
            url: &self.url,
            origin: &self.origin,
            headers: &mut self.headers,
            client: self.client,
            document: self.document.clone(),
            log_to: &self.log_to,
        }
    }
}

/// A response an applet built.
#[derive(Clone, Debug)]
pub struct Built {
    /// Status.
    pub status: StatusCode,
    /// Headers, in the order added.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// The body, in the pieces it was written in: ranges of cached bodies are slices of the
    /// cache's own bytes, so a response mostly made of the document copies little of it.
    pub parts: Vec<Bytes>,
}

impl Built {
    /// The body's length.
    pub fn body_len(&self) -> u64 {
        self.parts.iter().map(|p| p.len() as u64).sum()
    }

    /// The body in one piece (a copy when it has several).
    pub fn body(&self) -> Bytes {
        match self.parts.as_slice() {
            [] => Bytes::new(),
            [one] => one.clone(),
            parts => parts.concat().into(),
        }
    }
}
