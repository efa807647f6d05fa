//! Deciding a rule list for one request with what the proxy knows or can learn of it: the one
//! place the facts of [`meshcache_policy::Request`] are gathered.
//!
//! Every rule list of a node — access, routing, caching — is decided here. A fact that costs a
//! lookup is learnt only when a rule asks for it ([`meshcache_policy::Need`]), once per request
//! (the [`Facts`] keep it for the next list): the destination's addresses through the resolver
//! the origin connection uses, the user by checking the request's credentials
//! ([`meshcache_auth`], remembered there), a group membership by asking the group helper.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use meshcache_auth::{Authenticator, Verdict};
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

/// Who sent a request, as far as the rules may ask.
#[derive(Clone, Copy)]
pub(crate) struct Requester<'a> {
    /// The client's address.
    pub addr: IpAddr,
    /// The `Proxy-Authorization` value, if the request has one.
    pub credentials: Option<&'a [u8]>,
    /// The node's authenticator, when `[auth]` is configured.
    pub auth: Option<&'a Authenticator>,
}

/// What has been learnt of one request so far, kept from one rule list to the next.
#[derive(Debug, Default)]
pub(crate) struct Facts {
    /// The destination's addresses, once resolved (empty: the name does not resolve).
    pub addrs: Option<Arc<[IpAddr]>>,
    /// The user, once the credentials were checked (`Some(None)`: no valid credentials).
    pub user: Option<Option<Arc<str>>>,
    /// The user name the credentials gave, valid or not: what the access log shows.
    pub named: Option<Arc<str>>,
    /// Group memberships of the user asked so far.
    pub groups: Vec<(Arc<str>, bool)>,
    /// The `[[access]]` rule (from 0) that allowed the request, if one did.
    pub allowed_by: Option<usize>,
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
}

/// Decides `rules` for a request from `who`, learning what they ask for into `facts`.
pub(crate) async fn decide(
    rules: &Rules,
    resolver: &Resolver,
    clock: &LocalClock,
    who: Requester<'_>,
    subject: &Subject<'_>,
    facts: &mut Facts,
) -> Decided {
    if rules.is_empty() {
        return Decided::NoMatch;
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut from = 0;
    loop {
        let decision = {
            let groups: Vec<(&str, bool)> = facts.groups.iter().map(|(g, m)| (&**g, *m)).collect();
            let req = Request {
                src: who.addr,
                dst: match facts.addrs.as_deref() {
                    None => Fact::Unknown,
                    Some([]) => Fact::Absent,
                    Some(a) => Fact::Known(a),
                },
                host: subject.host,
                port: subject.port,
                method: subject.method,
                scheme: subject.scheme,
                url: subject.url,
                user: match &facts.user {
                    None => Fact::Unknown,
                    Some(None) => Fact::Absent,
                    Some(Some(user)) => Fact::Known(&**user),
                },
                groups: &groups,
                now: clock.moment(now),
            };
            rules.decide(&req, from)
        };
        match decision {
            Decision::Matched { rule, action } => return Decided::Rule(rule, action),
            Decision::NoMatch => return Decided::NoMatch,
            Decision::Challenge { rule } => return Decided::Challenge(rule),
            Decision::Need { rule, need } => {
                from = rule;
                learn(need, who, subject, resolver, facts).await;
            }
        }
    }
}

/// Learns what a rule needs.
async fn learn(
    need: Need<'_>,
    who: Requester<'_>,
    subject: &Subject<'_>,
    resolver: &Resolver,
    facts: &mut Facts,
) {
    match need {
        Need::Dst => {
            facts.addrs = Some(resolver.lookup(subject.host).await.unwrap_or_default());
        }
        Need::User => {
            let (Some(value), Some(auth)) = (who.credentials, who.auth) else {
                facts.user = Some(None);
                return;
            };
            facts.user = Some(match auth.check(value).await {
                Verdict::User(user) => {
                    facts.named = Some(user.clone());
                    Some(user)
                }
                Verdict::Rejected { user } => {
                    facts.named = Some(user);
                    None
                }
                Verdict::Malformed => None,
                Verdict::Unavailable => {
                    tracing::warn!(client = %who.addr, "authentication unavailable: the helpers did not answer");
                    None
                }
            });
        }
        Need::Group(group) => {
            let member = match (who.auth, facts.user.as_ref().and_then(Option::as_ref)) {
                (Some(auth), Some(user)) => auth.in_group(user, group).await.unwrap_or_else(|e| {
                    tracing::warn!(%user, group, error = %e, "group lookup failed: taken as not a member");
                    false
                }),
                _ => false,
            };
            facts.groups.push((group.into(), member));
        }
    }
}
