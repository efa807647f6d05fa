//! Who may use the proxy for what, per request.
//!
//! In order: `http.allow` (per connection: a client outside it is refused before its request
//! is read further), `http.connect_ports` (a CONNECT elsewhere is refused), then the access
//! rules (`[[access]]`, [`meshcache_policy`]): the first rule that matches decides, and once
//! there is a rule, a request that matches none is denied.
//!
//! In the spirit of Squid's default `http_access deny to_localhost`: a client that is not on
//! this host may not reach a loopback address, an unspecified one (`0.0.0.0` reaches this
//! host) or one of this node's own addresses through the proxy (the admin listener, services
//! bound to loopback), unless the rule that allows the request names its destination with
//! `dst`. Accelerated requests (to `http.accelerate`, an origin the operator named) and the
//! node's own digest and summary URLs are not forwarded anywhere and are not checked for it.
//!
//! The rules are decided by [`crate::decide`], which learns the facts they ask for: a rule that
//! names `user` or `group` checks the request's `Proxy-Authorization` ([`meshcache_auth`]); without
//! valid credentials the client is asked for them (407 with `Proxy-Authenticate`).

use std::net::IpAddr;
use std::sync::Arc;

use meshcache_policy::time::LocalClock;
use meshcache_policy::{Action, RuleConfig, Rules};

use crate::config::{Config, ConfigError};
use crate::decide::{decide, Decided, Facts, Requester, Subject};
use crate::resolve::Resolver;

/// The answer for one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Go on.
    Allow,
    /// Refused: 403.
    Deny(Denial),
}

/// Why a request was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Denial {
    /// Rule `n` (from 1) denied it.
    Rule(usize),
    /// No rule matched.
    NoRule,
    /// A CONNECT to a port `http.connect_ports` does not list.
    ConnectPort(u16),
    /// A client off this host asked for a destination on it.
    ToLocalhost(IpAddr),
    /// Rule `n` (from 1) names users, and the request has no valid credentials: 407.
    AuthRequired(usize),
}

impl Denial {
    /// The `X-Meshcache-Error` token.
    pub(crate) fn token(&self) -> &'static str {
        match self {
            Denial::ConnectPort(_) => "connect-port",
            Denial::ToLocalhost(_) => "to-localhost",
            Denial::AuthRequired(_) => "auth-required",
            _ => "access-denied",
        }
    }

    /// The status: 407 when credentials would help, 403 otherwise.
    pub(crate) fn status(&self) -> http::StatusCode {
        match self {
            Denial::AuthRequired(_) => http::StatusCode::PROXY_AUTHENTICATION_REQUIRED,
            _ => http::StatusCode::FORBIDDEN,
        }
    }

    /// The sentence the client reads.
    pub(crate) fn reason(&self) -> String {
        match self {
            Denial::Rule(n) => format!("access denied by access rule {n}"),
            Denial::NoRule => "access denied: no access rule allows this request".into(),
            Denial::ConnectPort(port) => {
                format!("CONNECT to port {port} is not allowed (http.connect_ports)")
            }
            Denial::ToLocalhost(ip) => format!(
                "access denied: {ip} is this proxy's own host, which clients elsewhere may not reach through it"
            ),
            Denial::AuthRequired(n) => {
                format!("access rule {n} needs you to log in: send valid proxy credentials")
            }
        }
    }
}

/// The access rules of a node and what they need at hand.
pub(crate) struct Access {
    rules: Rules,
    /// The ports CONNECT may reach, whatever the rules say.
    connect_ports: Vec<u16>,
    /// This node's addresses: every interface's and every listener's.
    own: Vec<IpAddr>,
    /// For each rule, whether it names the method `PURGE` as a plain item.
    names_purge: Vec<bool>,
    clock: LocalClock,
}

impl Access {
    /// Compiles the rules (reading the named lists) and lists this node's addresses.
    pub(crate) fn new(config: &Config) -> Result<Self, ConfigError> {
        let rules = config.access_rules()?;
        let mut own: Vec<IpAddr> = if_addrs::get_if_addrs()
            .map(|ifs| ifs.iter().map(|i| i.ip()).collect())
            .unwrap_or_else(|e| {
                tracing::warn!(error = %e, "cannot list this host's addresses: only loopback and the listeners' are kept from remote clients");
                Vec::new()
            });
        own.extend(config.http.listen.iter().map(|a| a.ip()));
        own.extend(config.admin.listen.map(|a| a.ip()));
        own.sort_unstable();
        own.dedup();
        Ok(Self {
            rules,
            connect_ports: config.http.connect_ports.clone(),
            own,
            names_purge: config.access.iter().map(names_purge).collect(),
            clock: LocalClock::default(),
        })
    }

    /// Whether the rule that allowed a request (`facts.allowed_by`) allows PURGE: it names the
    /// method `PURGE` in as many words (Squid enables PURGE only when an ACL names the method).
    /// With no access rule, nothing allows it.
    pub(crate) fn allows_purge(&self, facts: &Facts) -> bool {
        facts
            .allowed_by
            .is_some_and(|rule| self.names_purge.get(rule).copied().unwrap_or(false))
    }

    /// Decides one request from `who`, keeping what it learnt in `facts` (for the routing
    /// rules, and the user for the log).
    pub(crate) async fn check(
        &self,
        resolver: &Resolver,
        who: Requester<'_>,
        subject: &Subject<'_>,
        facts: &mut Facts,
    ) -> Verdict {
        if subject.scheme.is_none() && !self.connect_ports.contains(&subject.port) {
            return Verdict::Deny(Denial::ConnectPort(subject.port));
        }
        let local_client = on_this_host(who.addr);
        if self.rules.is_empty() {
            if local_client || !subject.forwarded {
                return Verdict::Allow;
            }
            return self.off_host(resolver, subject.host, None).await;
        }
        let decided = decide(&self.rules, resolver, &self.clock, who, subject, facts).await;
        match decided {
            Decided::Rule(rule, Action::Deny) => Verdict::Deny(Denial::Rule(rule + 1)),
            Decided::Rule(rule, Action::Allow) => {
                facts.allowed_by = Some(rule);
                let names_dst = self.rules.rule(rule).is_some_and(|r| r.names_dst());
                if local_client || names_dst || !subject.forwarded {
                    Verdict::Allow
                } else {
                    self.off_host(resolver, subject.host, facts.addrs.clone())
                        .await
                }
            }
            Decided::NoMatch => Verdict::Deny(Denial::NoRule),
            Decided::Challenge(rule) => Verdict::Deny(Denial::AuthRequired(rule + 1)),
        }
    }

    /// The check for a client off this host: none of the destination's addresses may be this
    /// host's.
    async fn off_host(
        &self,
        resolver: &Resolver,
        host: &str,
        addrs: Option<Arc<[IpAddr]>>,
    ) -> Verdict {
        let addrs = match addrs {
            Some(a) => a,
            // A name that does not resolve reaches nothing here; the fetch will say so.
            None => resolver.lookup(host).await.unwrap_or_default(),
        };
        match addrs.iter().find(|a| self.is_own(**a)) {
            Some(ip) => Verdict::Deny(Denial::ToLocalhost(*ip)),
            None => Verdict::Allow,
        }
    }

    /// Whether `ip` reaches this host.
    fn is_own(&self, ip: IpAddr) -> bool {
        on_this_host(ip) || ip.is_unspecified() || self.own.binary_search(&ip).is_ok()
    }
}

/// Loopback, also as an IPv4-mapped IPv6 address.
fn on_this_host(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => a.is_loopback(),
        IpAddr::V6(a) => a.is_loopback() || a.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback()),
    }
}

/// Whether a rule names the method `PURGE` as a plain item (not `!PURGE`, not through a list).
fn names_purge(rule: &RuleConfig) -> bool {
    rule.method.iter().any(|m| m == "PURGE")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn purge_needs_the_method_named() {
        let rule = |methods: &[&str]| RuleConfig {
            method: methods.iter().map(|m| (*m).to_owned()).collect(),
            ..RuleConfig::new(Action::Allow)
        };
        assert!(names_purge(&rule(&["GET", "PURGE"])));
        assert!(!names_purge(&rule(&[])));
        assert!(!names_purge(&rule(&["!GET"])));
        assert!(!names_purge(&rule(&["purge"])));
    }
}
