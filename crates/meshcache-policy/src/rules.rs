//! An ordered rule list: the first rule that matches decides.

use crate::config::{Action, RuleConfig};
use crate::domain_index::{DomainIndex, HostProbe};
use crate::list::Lists;
use crate::rule::{Match, Need, Request, Rule};
use crate::RuleError;

/// A compiled, ordered list of rules.
#[derive(Debug, Default)]
pub struct Rules {
    rules: Vec<Rule>,
    /// Every rule's `domain` sets.
    domains: DomainIndex,
}

/// What the rules say about a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision<'r> {
    /// Rule `rule` (from 0) matched.
    Matched {
        /// Its position, from 0.
        rule: usize,
        /// What it says.
        action: Action,
    },
    /// No rule matched.
    NoMatch,
    /// Rule `rule` needs a fact: learn it and call [`Rules::decide`] again from `rule`.
    Need {
        /// Where to resume.
        rule: usize,
        /// What to learn.
        need: Need<'r>,
    },
    /// Rule `rule` names users and the request has no valid credentials: ask for them (407).
    Challenge {
        /// The rule, from 0.
        rule: usize,
    },
}

impl Rules {
    /// Compiles rules as configured; an error names the rule (from 1) and key.
    pub fn compile(configs: &[RuleConfig], lists: &Lists) -> Result<Self, RuleError> {
        let mut domains = DomainIndex::default();
        let rules = configs
            .iter()
            .enumerate()
            .map(|(i, c)| Rule::compile(i + 1, c, lists, &mut domains))
            .collect::<Result<_, _>>()?;
        Ok(Self { rules, domains })
    }

    /// Whether there are no rules.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// How many rules there are.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// Rule `i` (from 0).
    pub fn rule(&self, i: usize) -> Option<&Rule> {
        self.rules.get(i)
    }

    /// Whether any rule names users or groups.
    pub fn names_users(&self) -> bool {
        self.rules.iter().any(Rule::names_user)
    }

    /// Whether any rule names groups.
    pub fn names_groups(&self) -> bool {
        self.rules.iter().any(Rule::names_group)
    }

    /// Decides `req`, looking at rules from `from` (0 to start).
    pub fn decide(&self, req: &Request<'_>, from: usize) -> Decision<'_> {
        let mut host = HostProbe::new(&self.domains, req.host);
        for (i, rule) in self.rules.iter().enumerate().skip(from) {
            match rule.check(req, &mut host) {
                Match::No => continue,
                Match::Yes => {
                    return Decision::Matched {
                        rule: i,
                        action: rule.action(),
                    }
                }
                Match::Need(need) => return Decision::Need { rule: i, need },
                Match::Unauthenticated => return Decision::Challenge { rule: i },
            }
        }
        Decision::NoMatch
    }
}
