//! The TOML shape of a rule, as written in `[[access]]` (and the other rule lists).
//!
//! Items stay strings here, exactly as written, so a config round-trips and `meshcache config
//! check` can name the rule and key at fault; [`crate::Rules::compile`] turns them into sets.

use serde::{Deserialize, Serialize};

/// What a matching rule does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// The request may go on.
    Allow,
    /// The request is refused.
    Deny,
}

/// One rule: an action and the matchers that must all match. An absent key matches anything.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleConfig {
    /// `allow` or `deny`.
    pub action: Action,
    /// The client's address: CIDRs (`10.0.0.0/8`) or addresses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub src: Vec<String>,
    /// The origin's resolved address: CIDRs or addresses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dst: Vec<String>,
    /// The origin's host name: `example.com` (that host) or `.example.com` (it and every
    /// subdomain), as Squid's `dstdomain`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub domain: Vec<String>,
    /// Regular expressions (the `regex` crate's syntax; `(?i)` makes one case-insensitive)
    /// searched in the whole URL (`host:port` for CONNECT).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub url_regex: Vec<String>,
    /// The origin's port: `443` or a range `1025-65535`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub port: Vec<String>,
    /// Request methods, as sent (`GET`, `CONNECT`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub method: Vec<String>,
    /// The URL's scheme (`http`); a CONNECT request has none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scheme: Vec<String>,
    /// Authenticated user names; `*` is any authenticated user.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub user: Vec<String>,
    /// Groups of the authenticated user, as the group helper answers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub group: Vec<String>,
    /// Local time windows: `"Mon-Fri 08:00-18:00"`, `"Sat,Sun"`, `"12:00-13:30"`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub time: Vec<String>,
}

impl RuleConfig {
    /// A rule with `action` and no matchers: it matches every request.
    pub fn new(action: Action) -> Self {
        Self {
            action,
            src: Vec::new(),
            dst: Vec::new(),
            domain: Vec::new(),
            url_regex: Vec::new(),
            port: Vec::new(),
            method: Vec::new(),
            scheme: Vec::new(),
            user: Vec::new(),
            group: Vec::new(),
            time: Vec::new(),
        }
    }
}
