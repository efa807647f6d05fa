//! What the cooperation code uses of the node around it: its configuration, its cache, its
//! HTTP client, its `Via`, its time accounting, and the [`Link`]. The node (`Shared`, in the
//! crate's root) implements [`Host`]; the files of `coop/` take a host instead of naming the
//! node, so the node imports them and none of them imports it back.

use http::HeaderValue;

use super::link::Link;
use crate::cache::Cache;
use crate::config::Config;
use crate::efficiency::Efficiency;
use crate::upstream::Upstream;

/// The node, as its cooperation code sees it.
pub(crate) trait Host: Send + Sync + 'static {
    /// The node's configuration.
    fn config(&self) -> &Config;
    /// The node's cache (holding checks, the keys a summary or the directory is rebuilt from).
    fn cache(&self) -> &Cache;
    /// The engine, the ICP socket, the waiters and the counters.
    fn link(&self) -> &Link;
    /// Pooled HTTP connections (summary and digest fetches).
    fn upstream(&self) -> &Upstream;
    /// Our own `Via` entry, for the requests we make.
    fn via(&self) -> &HeaderValue;
    /// Where the node's time goes (work for peers, work for our own searches).
    fn efficiency(&self) -> &Efficiency;
}
