//! Caching policy: what the operator decides beyond what origins say.
//!
//! - **Refresh patterns** (`[[cache.refresh]]`, Squid's `refresh_pattern`): the first whose
//!   `url_regex` matches a URL gives the freshness of its responses that carry none (min,
//!   percent of the age since `Last-Modified`, max), and the options that overrule RFC 9111
//!   (`override_expire`, `override_lastmod`, `ignore_reload`). All of the patterns' expressions
//!   are one `RegexSet`: one pass over the URL, the lowest matching index wins. The arithmetic
//!   is pure, in [`crate::semantics::Refresh`].
//! - **Cache rules** (`[[cache.rules]]`, Squid's `cache allow|deny`): a request the first
//!   matching rule denies is neither answered from the store nor stored. Decided by
//!   [`crate::decide`], with the access rules' matchers.
//! - **Targeted fields** (`cache.targeted_fields`, RFC 9213): which `CDN-Cache-Control`-like
//!   fields this node obeys over `Cache-Control`.
//! - **PURGE** is allowed by the access rules ([`crate::access::Access::allows_purge`]).

use meshcache_policy::time::LocalClock;
use meshcache_policy::{Action, Rules};
use regex::RegexSet;

use crate::config::{Config, ConfigError};
use crate::decide::{decide, Decided, Facts, Requester, Subject};
use crate::resolve::Resolver;
use crate::semantics::Refresh;

/// The targeted fields (RFC 9213) of `cache.targeted_fields`, or by mode when it is left out:
/// an accelerator speaks for the origin, as a CDN does, so the origin's CDN directives are
/// addressed to it; a forward proxy speaks for its clients, and a site's CDN directives (often
/// longer lifetimes than `Cache-Control` gives the caches it does not run) are not meant for it.
fn targeted_fields(config: &Config) -> Vec<http::HeaderName> {
    let names: Vec<String> = match &config.cache.targeted_fields {
        Some(names) => names.clone(),
        None if config.http.accelerate.is_some() => crate::config::ACCELERATOR_TARGETED_FIELDS
            .iter()
            .map(|s| (*s).to_owned())
            .collect(),
        None => Vec::new(),
    };
    names
        .iter()
        .filter_map(|n| http::HeaderName::from_bytes(n.to_ascii_lowercase().as_bytes()).ok())
        .collect()
}

/// A node's caching policy, compiled.
pub(crate) struct Caching {
    /// Every refresh pattern's expression, pattern `i` the set's `i`th.
    patterns: Option<RegexSet>,
    /// Every refresh pattern's numbers, in the same order.
    refresh: Vec<Refresh>,
    /// `[[cache.rules]]`.
    rules: Rules,
    clock: LocalClock,
    /// Targeted cache-control fields (RFC 9213), in precedence order.
    targeted: Vec<http::HeaderName>,
}

impl Caching {
    /// Compiles the refresh patterns and the cache rules (reading the named lists).
    pub(crate) fn new(config: &Config) -> Result<Self, ConfigError> {
        let secs = |d: std::time::Duration| d.as_secs();
        Ok(Self {
            patterns: config.refresh_patterns()?,
            refresh: config
                .cache
                .refresh
                .iter()
                .map(|p| Refresh {
                    min: secs(p.min),
                    percent: p.percent,
                    max: secs(p.max),
                    override_expire: p.override_expire,
                    override_lastmod: p.override_lastmod,
                    ignore_reload: p.ignore_reload,
                })
                .collect(),
            rules: config.cache_rules()?,
            clock: LocalClock::default(),
            targeted: targeted_fields(config),
        })
    }

    /// The targeted cache-control fields this node obeys, first first.
    pub(crate) fn targeted(&self) -> &[http::HeaderName] {
        &self.targeted
    }

    /// The refresh pattern for `url`: the first that matches, if any.
    pub(crate) fn refresh(&self, url: &str) -> Option<&Refresh> {
        let first = self.patterns.as_ref()?.matches(url).iter().next()?;
        self.refresh.get(first)
    }

    /// Whether the cache rules let this request use the cache: the first matching rule
    /// decides, a request none matches does. A rule that names users, for a request without
    /// valid credentials, keeps it out of the cache: that is never wrong.
    pub(crate) async fn caches(
        &self,
        resolver: &Resolver,
        who: Requester<'_>,
        subject: &Subject<'_>,
        facts: &mut Facts,
    ) -> bool {
        if self.rules.is_empty() {
            return true;
        }
        let decided = decide(&self.rules, resolver, &self.clock, who, subject, facts).await;
        matches!(decided, Decided::Rule(_, Action::Allow) | Decided::NoMatch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RefreshConfig;

    #[test]
    fn first_matching_pattern_wins() {
        let mut config = Config::default();
        config.cache.refresh = vec![
            RefreshConfig {
                min: std::time::Duration::from_secs(60),
                ..RefreshConfig::new(r"(?i)\.deb$")
            },
            RefreshConfig {
                percent: 50,
                ..RefreshConfig::new(r"\.deb$")
            },
            RefreshConfig::new("."),
        ];
        let caching = Caching::new(&config).expect("compiles");
        let deb = caching.refresh("http://a.test/x.DEB").expect("matches");
        assert_eq!((deb.min, deb.percent), (60, 20));
        let other = caching.refresh("http://a.test/x.html").expect("matches");
        assert_eq!((other.min, other.max), (0, 3 * 24 * 3600));
        config.cache.refresh.pop();
        let caching = Caching::new(&config).expect("compiles");
        assert!(caching.refresh("http://a.test/x.html").is_none());
        assert!(Caching::new(&Config::default())
            .expect("default")
            .refresh("http://a.test/")
            .is_none());
    }
}
