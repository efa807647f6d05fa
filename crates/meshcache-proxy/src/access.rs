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
//! Facts that cost a lookup are learnt only when a rule needs them ([`meshcache_policy::Need`]):
//! the destination's addresses through the resolver the connection to the origin will use.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use meshcache_policy::time::LocalClock;
use meshcache_policy::{Action, Decision, Fact, Need, Request, Rules};

use crate::config::{Config, ConfigError};
use crate::resolve::Resolver;

/// What a request asks for, as the rules see it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Subject<'a> {
    /// The origin's host, lower-case.
    pub host: &'a str,
    /// The origin's port.
    pub port: u16,
    /// The URL's scheme; `None` for CONNECT (and only for CONNECT).
    pub scheme: Option<&'a str>,
    /// The URL (`host:port` for CONNECT).
    pub url: &'a str,
    /// The method.
    pub method: &'a str,
    /// Whether the request leaves this node for its destination: not for the node's own
    /// digest and summary, nor for accelerated requests to the configured origin.
    pub forwarded: bool,
}

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
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let known: Option<Arc<[IpAddr]>> = resolver.known(subject.host).map(|ip| Arc::from([ip]));
        let req = Request {
            src: client,
            dst: known.as_deref().map_or(Fact::Unknown, Fact::Known),
            host: subject.host,
            port: subject.port,
            method: subject.method,
            scheme: subject.scheme,
            url: subject.url,
            user: Fact::Absent,
            groups: &[],
            now: self.clock.moment(now),
        };
        let (decision, addrs) = match self.rules.decide(&req, 0) {
            // A rule needs the destination: resolve it, and decide again from that rule.
            Decision::Need {
                rule,
                need: Need::Dst,
            } => {
                let addrs = resolver.lookup(subject.host).await.unwrap_or_default();
                let dst = if addrs.is_empty() {
                    Fact::Absent
                } else {
                    Fact::Known(&*addrs)
                };
                (
                    self.rules.decide(&Request { dst, ..req }, rule),
                    Some(addrs),
                )
            }
            decision => (decision, known.clone()),
        };
        match decision {
            Decision::Matched {
                rule,
                action: Action::Deny,
            } => Verdict::Deny(Denial::Rule(rule + 1)),
            Decision::Matched {
                rule,
                action: Action::Allow,
            } => {
                let names_dst = self.rules.rule(rule).is_some_and(|r| r.names_dst());
                if local_client || names_dst || !subject.forwarded {
                    Verdict::Allow
                } else {
                    self.off_host(resolver, subject.host, addrs).await
                }
            }
            Decision::NoMatch => Verdict::Deny(Denial::NoRule),
            Decision::Need { rule, .. } | Decision::Challenge { rule } => {
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
