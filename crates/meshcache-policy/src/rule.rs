//! One compiled rule, and what a request tells the rules about itself.

use std::net::IpAddr;

use crate::config::{Action, RuleConfig};
use crate::domain::DomainSet;
use crate::domain_index::{DomainIndex, DomainMatcher, HostProbe};
use crate::ipset::IpSet;
use crate::items::{BuildError, ItemSet, Items};
use crate::list::Lists;
use crate::names::{Group, Method, NameSet, Scheme, User};
use crate::port::PortSet;
use crate::time::{Moment, TimeSet};
use crate::url::UrlSet;
use crate::RuleError;

/// Something about a request that may not be known yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fact<T> {
    /// Not looked up yet: a rule that needs it asks for it.
    Unknown,
    /// Looked up, and there is none (no credentials, a name that did not resolve).
    Absent,
    /// Known.
    Known(T),
}

/// What the rules see of a request.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    /// The client's address.
    pub src: IpAddr,
    /// The origin's addresses, once resolved (a `dst` item matches if any of them does, as
    /// Squid's `dst`); `Absent` when the name does not resolve.
    pub dst: Fact<&'a [IpAddr]>,
    /// The origin's host, lower-case.
    pub host: &'a str,
    /// The origin's port.
    pub port: u16,
    /// The method, as sent.
    pub method: &'a str,
    /// The URL's scheme, lower-case; `None` for CONNECT.
    pub scheme: Option<&'a str>,
    /// The URL (`host:port` for CONNECT).
    pub url: &'a str,
    /// The authenticated user, once credentials are checked; `Absent` without valid ones.
    pub user: Fact<&'a str>,
    /// The groups of `user` asked so far, and the answers.
    pub groups: &'a [(&'a str, bool)],
    /// The local time.
    pub now: Moment,
}

/// A fact a rule needs before it can decide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need<'r> {
    /// The origin's address (resolve the host).
    Dst,
    /// The user (check the request's credentials).
    User,
    /// Whether the user is in this group (ask the group helper).
    Group(&'r str),
}

/// How one rule stands against a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Match<'r> {
    Yes,
    No,
    /// Every known matcher matches; this fact decides.
    Need(Need<'r>),
    /// Every other matcher matches, and the rule names users or groups: without credentials
    /// (or with wrong ones) the client is asked for them, as Squid's `proxy_auth` does.
    Unauthenticated,
}

/// A compiled rule.
#[derive(Debug)]
pub struct Rule {
    action: Action,
    method: Option<Items<NameSet<Method>>>,
    port: Option<Items<PortSet>>,
    scheme: Option<Items<NameSet<Scheme>>>,
    src: Option<Items<IpSet>>,
    domain: Option<DomainMatcher>,
    time: Option<Items<TimeSet>>,
    url: Option<Items<UrlSet>>,
    dst: Option<Items<IpSet>>,
    user: Option<Items<NameSet<User>>>,
    group: Option<Items<NameSet<Group>>>,
}

fn build<S: ItemSet>(
    rule: usize,
    key: &'static str,
    items: &[String],
    lists: &Lists,
) -> Result<Option<Items<S>>, RuleError> {
    Items::build(items, lists).map_err(|e| match e {
        BuildError::Item(reason) => RuleError::Item { rule, key, reason },
        BuildError::List(e) => e,
    })
}

fn is<S: ItemSet>(items: &Option<Items<S>>, probe: S::Probe<'_>) -> bool {
    items.as_ref().is_none_or(|m| m.matches(probe))
}

impl Rule {
    /// Compiles rule number `rule` (from 1, for errors); its `domain` sets go into `domains`,
    /// the index of its rule list.
    pub(crate) fn compile(
        rule: usize,
        config: &RuleConfig,
        lists: &Lists,
        domains: &mut DomainIndex,
    ) -> Result<Self, RuleError> {
        let domain = build::<DomainSet>(rule, "domain", &config.domain, lists)?.map(|items| {
            let (plain, negated) = items.into_parts();
            DomainMatcher {
                plain: plain.map(|s| domains.add(s)),
                negated: negated.map(|s| domains.add(s)),
            }
        });
        Ok(Self {
            action: config.action,
            method: build(rule, "method", &config.method, lists)?,
            port: build(rule, "port", &config.port, lists)?,
            scheme: build(rule, "scheme", &config.scheme, lists)?,
            src: build(rule, "src", &config.src, lists)?,
            domain,
            time: build(rule, "time", &config.time, lists)?,
            url: build(rule, "url_regex", &config.url_regex, lists)?,
            dst: build(rule, "dst", &config.dst, lists)?,
            user: build(rule, "user", &config.user, lists)?,
            group: build(rule, "group", &config.group, lists)?,
        })
    }

    /// What the rule does when it matches.
    pub fn action(&self) -> Action {
        self.action
    }

    /// Whether the rule names destination addresses.
    pub fn names_dst(&self) -> bool {
        self.dst.is_some()
    }

    /// Whether the rule names users or groups (needs authentication).
    pub fn names_user(&self) -> bool {
        self.user.is_some() || self.group.is_some()
    }

    /// Whether the rule names groups.
    pub fn names_group(&self) -> bool {
        self.group.is_some()
    }

    /// How the rule stands against `req`, whose host is probed in the rule list's domain
    /// index: the cheap, known matchers first, so a rule that fails on them never asks for a
    /// fact that costs a lookup.
    pub(crate) fn check<'r>(&'r self, req: &Request<'_>, host: &mut HostProbe<'_>) -> Match<'r> {
        let known = is(&self.method, req.method)
            && is(&self.port, req.port)
            && self
                .scheme
                .as_ref()
                .is_none_or(|m| m.matches_option(req.scheme))
            && is(&self.src, req.src)
            && self.domain.is_none_or(|d| d.matches(host))
            && is(&self.time, req.now)
            && is(&self.url, req.url);
        if !known {
            return Match::No;
        }
        if let Some(dst) = &self.dst {
            match req.dst {
                Fact::Unknown => return Match::Need(Need::Dst),
                // A host that does not resolve has no address: only negated items match it.
                Fact::Absent => {
                    if !dst.matches_nothing() {
                        return Match::No;
                    }
                }
                // Any address in a plain item, and none in a negated one: `!10.0.0.0/8` is
                // "no address of the name is in 10.0.0.0/8".
                Fact::Known(addrs) => {
                    let any_in = |set: &IpSet| addrs.iter().any(|a| set.contains_addr(*a));
                    if !dst.plain().is_none_or(any_in) || dst.negated().is_some_and(any_in) {
                        return Match::No;
                    }
                }
            }
        }
        if !self.names_user() {
            return Match::Yes;
        }
        let user = match req.user {
            Fact::Unknown => return Match::Need(Need::User),
            Fact::Absent => return Match::Unauthenticated,
            Fact::Known(user) => user,
        };
        if !is(&self.user, user) {
            return Match::No;
        }
        match &self.group {
            None => Match::Yes,
            Some(groups) => groups.decide(|group| {
                req.groups
                    .iter()
                    .find(|(g, _)| *g == group)
                    .map(|&(_, member)| member)
            }),
        }
    }
}

impl<S: ItemSet> Items<S> {
    /// Whether the matcher matches a request that has nothing to offer it (no scheme, no
    /// address): only when it has no plain items.
    pub(crate) fn matches_nothing(&self) -> bool {
        self.plain().is_none()
    }
}

impl Items<NameSet<Scheme>> {
    fn matches_option(&self, scheme: Option<&str>) -> bool {
        match scheme {
            Some(s) => self.matches(s),
            None => self.matches_nothing(),
        }
    }
}

impl Items<NameSet<Group>> {
    /// Membership in any plain group and in no negated one, asking for the first unknown
    /// membership the answer depends on.
    fn decide<'r>(&'r self, known: impl Fn(&str) -> Option<bool>) -> Match<'r> {
        for group in self.negated().into_iter().flat_map(NameSet::names) {
            match known(group) {
                None => return Match::Need(Need::Group(group)),
                Some(true) => return Match::No,
                Some(false) => {}
            }
        }
        let Some(plain) = self.plain() else {
            return Match::Yes;
        };
        let mut unknown = None;
        for group in plain.names() {
            match known(group) {
                Some(true) => return Match::Yes,
                Some(false) => {}
                None => unknown = unknown.or(Some(group)),
            }
        }
        match unknown {
            Some(group) => Match::Need(Need::Group(group)),
            None => Match::No,
        }
    }
}
