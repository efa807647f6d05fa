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
//! The rules are decided by [`crate::decide`], which learns the facts they ask for.

use std::net::IpAddr;
use std::sync::Arc;

use meshcache_policy::time::LocalClock;
use meshcache_policy::{Action, Rules};

use crate::config::{Config, ConfigError};
use crate::decide::{decide, Decided, Facts, Subject};
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
    /// A rule needs what this node cannot learn (a user without authentication).
    Unresolvable(usize),
}

impl Denial {
    /// The `X-Meshcache-Error` token.
    pub(crate) fn token(&self) -> &'static str {
        match self {
            Denial::ConnectPort(_) => "connect-port",
            Denial::ToLocalhost(_) => "to-localhost",
            _ => "access-denied",
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
            Denial::Unresolvable(n) => {
                format!("access denied: access rule {n} needs a fact this node cannot learn")
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
            clock: LocalClock::default(),
        })
    }

    /// The compiled `[[access]]` rules (a PURGE asks which one allowed it).
    pub(crate) fn rules(&self) -> &Rules {
        &self.rules
    }

    /// Decides one request from `client`.
    pub(crate) async fn check(
        &self,
        resolver: &Resolver,
        client: IpAddr,
        subject: &Subject<'_>,
    ) -> Verdict {
        if subject.scheme.is_none() && !self.connect_ports.contains(&subject.port) {
            return Verdict::Deny(Denial::ConnectPort(subject.port));
        }
        let local_client = on_this_host(client);
        if self.rules.is_empty() {
            if local_client || !subject.forwarded {
                return Verdict::Allow;
            }
            return self.off_host(resolver, subject.host, None).await;
        }
        let mut facts = Facts::default();
        let decided = decide(
            &self.rules,
            resolver,
            &self.clock,
            client,
            subject,
            &mut facts,
        )
        .await;
        match decided {
            Decided::Rule(rule, Action::Deny) => Verdict::Deny(Denial::Rule(rule + 1)),
            Decided::Rule(rule, Action::Allow) => {
                let names_dst = self.rules.rule(rule).is_some_and(|r| r.names_dst());
                if local_client || names_dst || !subject.forwarded {
                    Verdict::Allow
                } else {
                    self.off_host(resolver, subject.host, facts.addrs).await
                }
            }
            Decided::NoMatch => Verdict::Deny(Denial::NoRule),
            Decided::Challenge(rule) | Decided::Unresolvable(rule) => {
                Verdict::Deny(Denial::Unresolvable(rule + 1))
            }
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
