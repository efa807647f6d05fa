//! The applet a stored document runs, kept with the document in the cache (`CachedObject`)
//! so that its binding is worked out once; `applets.rs` makes and runs it.

use std::sync::Arc;

use meshcache_applet::Applet;

/// The applet a stored document runs, worked out once (on its first hit) and kept with it.
#[derive(Debug)]
pub struct Attached {
    /// Its module.
    pub(crate) module: Source,
    /// Where its log records go.
    pub(crate) log_to: Arc<str>,
    /// The document's origin (the applet's sandbox).
    pub(crate) origin: Arc<str>,
}

/// Where an attached applet's module comes from.
#[derive(Debug)]
pub(crate) enum Source {
    /// Compiled at start (a bound file).
    Compiled(Arc<Applet>),
    /// Fetched from this URL of the origin.
    Url(String),
}
