//! Routing rules: which requests must go through a parent (`[[never_direct]]`) and which must go
//! straight to the origin (`[[always_direct]]`), Squid's `never_direct` and `always_direct`.
//!
//! Each is an ordered rule list with the access rules' matchers ([`meshcache_policy`]); a rule
//! list "applies" to a request when the first rule that matches it says `allow`. `always_direct`
//! is decided first, as in Squid: a request it applies to goes to the origin without asking a
//! peer. A request `never_direct` applies to is sent only to peers: the route the cooperation
//! protocol chose without its origin hop, and, when that leaves no parent, every parent whose
//! HTTP side is up; with none up it fails at once with 503, never trying the origin. A CONNECT
//! it applies to is tunnelled through a parent (`CONNECT` sent to the parent).

use meshcache_policy::time::LocalClock;
use meshcache_policy::{Action, Rules};

use crate::config::{Config, ConfigError};
use crate::decide::{decide, Decided, Facts, Requester, Subject};
use crate::resolve::Resolver;

/// Where a request may go.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Directness {
    /// Wherever the cooperation protocol says.
    #[default]
    Either,
    /// Only to the origin (`always_direct`).
    Always,
    /// Only to peers (`never_direct`).
    Never,
}

/// A node's routing rules.
pub(crate) struct Routing {
    always: Rules,
    never: Rules,
    clock: LocalClock,
}

impl Routing {
    /// Compiles the rules (reading the named lists).
    pub(crate) fn new(config: &Config) -> Result<Self, ConfigError> {
        let (always, never) = config.routing_rules()?;
        Ok(Self {
            always,
            never,
            clock: LocalClock::default(),
        })
    }

    /// Where a request from `who` may go, with what the access rules learnt of it in `facts`.
    pub(crate) async fn directness(
        &self,
        resolver: &Resolver,
        who: Requester<'_>,
        subject: &Subject<'_>,
        facts: &mut Facts,
    ) -> Directness {
        if self.always.is_empty() && self.never.is_empty() {
            return Directness::Either;
        }
        for (rules, applies) in [
            (&self.always, Directness::Always),
            (&self.never, Directness::Never),
        ] {
            let decided = decide(rules, resolver, &self.clock, who, subject, facts).await;
            if matches!(decided, Decided::Rule(_, Action::Allow)) {
                return applies;
            }
        }
        Directness::Either
    }
}
