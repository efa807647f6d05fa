//! Policy rules: which requests a node serves, in Squid's model but written as TOML.
//!
//! A rule list is ordered; the first rule whose matchers all match a request decides it
//! (`allow` or `deny`). Each matcher is a list of items that matches when any of its plain items
//! matches (or it has none) and none of its `!`-negated items does, so
//! `port = ["!443", "!563"]` means "neither 443 nor 563", as Squid's `acl ... port` lines
//! read when negated on an `http_access` line. An item `@name` stands for every line of the named
//! list file (`[lists] name = "path"`), which is how 100,000-entry domain blocklists are kept.
//!
//! Layout:
//! - `config`: the serde shape of a rule (`[[access]]`) and of the named lists.
//! - `items`: the "any plain item, no negated item" combinator every matcher shares.
//! - `domain`, `ipset`, `port`, `names`, `url`, [`time`]: one file per kind of item set.
//! - `domain_index`: every `domain` matcher of a rule list in one table, one lookup per request.
//! - `list`: named list files, read once per load.
//! - `rule` and `rules`: a compiled rule and the ordered list that decides a [`Request`].
//!
//! Evaluation is pure: the caller passes what it knows of the request, including the time. Facts
//! that cost something to learn (the resolved destination address, the authenticated user, a
//! group membership) are [`Fact::Unknown`] until a rule needs them: the decision then says which
//! fact it needs ([`Decision::Need`]), the caller learns it and resumes from that rule. Rules
//! that fail on a known fact never ask for an unknown one, so a request the first rules settle
//! never costs a DNS lookup or a helper call.

mod config;
mod domain;
mod domain_index;
mod error;
mod ipset;
mod items;
mod list;
mod names;
mod port;
mod rule;
mod rules;
pub mod time;
mod url;

pub use config::{Action, RuleConfig};
pub use error::RuleError;
pub use list::Lists;
pub use rule::{Fact, Need, Request};
pub use rules::{Decision, Rules};
pub use time::Moment;
