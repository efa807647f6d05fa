//! Deciding a rule list for one request with what the proxy knows or can learn of it: the one
//! place the facts of [`meshcache_policy::Request`] are gathered.
//!
//! Every rule list of a node — access, routing, caching — is decided here. A fact that costs a
//! lookup is learnt only when a rule asks for it ([`meshcache_policy::Need`]), once per request
//! (the [`Facts`] keep it for the next list): the destination's addresses through the resolver
//! the origin connection uses.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use meshcache_policy::time::LocalClock;
use meshcache_policy::{Action, Decision, Fact, Need, Request, Rules};

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

/// What has been learnt of one request so far, kept from one rule list to the next.
#[derive(Debug, Default)]
pub(crate) struct Facts {
    /// The destination's addresses, once resolved (empty: the name does not resolve).
    pub addrs: Option<Arc<[IpAddr]>>,
}

/// How a rule list ended for a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Decided {
    /// Rule `n` (from 0) matched.
    Rule(usize, Action),
    /// No rule matched.
    NoMatch,
    /// Rule `n` names users and the request has no valid credentials.
    Challenge(usize),
    /// Rule `n` needs a fact this node cannot learn.
    Unresolvable(usize),
}

/// Decides `rules` for a request from `client`, learning what they ask for into `facts`.
pub(crate) async fn decide(
    rules: &Rules,
    resolver: &Resolver,
    clock: &LocalClock,
    client: IpAddr,
    subject: &Subject<'_>,
    facts: &mut Facts,
) -> Decided {
    if rules.is_empty() {
        return Decided::NoMatch;
    }
    if facts.addrs.is_none() {
        facts.addrs = resolver.known(subject.host).map(|ip| Arc::from([ip]));
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut from = 0;
    loop {
        let addrs = facts.addrs.clone();
        let req = Request {
            src: client,
            dst: match addrs.as_deref() {
                None => Fact::Unknown,
                Some([]) => Fact::Absent,
                Some(a) => Fact::Known(a),
            },
            host: subject.host,
            port: subject.port,
            method: subject.method,
            scheme: subject.scheme,
            url: subject.url,
            user: Fact::Absent,
            groups: &[],
            now: clock.moment(now),
        };
        match rules.decide(&req, from) {
            Decision::Matched { rule, action } => return Decided::Rule(rule, action),
            Decision::NoMatch => return Decided::NoMatch,
            Decision::Need {
                rule,
                need: Need::Dst,
            } if addrs.is_none() => {
                facts.addrs = Some(resolver.lookup(subject.host).await.unwrap_or_default());
                from = rule;
            }
            Decision::Need { rule, .. } => return Decided::Unresolvable(rule),
            Decision::Challenge { rule } => return Decided::Challenge(rule),
        }
    }
}
