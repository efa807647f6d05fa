//! Exact names: methods, schemes, user names and groups.
//!
//! Methods are matched as sent (HTTP methods are case-sensitive, RFC 9110 §9.1); schemes in
//! lower case; users and groups exactly (as Squid's `proxy_auth` without `-i`). A user item `*`
//! is any authenticated user, Squid's `proxy_auth REQUIRED`.

use std::marker::PhantomData;

use hashbrown::HashSet;

use crate::items::ItemSet;

/// Which kind of name a set holds: it decides what an item may look like.
pub trait NameKind: Default + std::fmt::Debug {
    /// Checks and normalises one item.
    fn normalise(item: &str) -> Result<String, String>;
    /// Whether `*` means "any name".
    const WILDCARD: bool = false;
}

/// Request methods: HTTP tokens.
#[derive(Debug, Default)]
pub struct Method;
/// URL schemes, lower case.
#[derive(Debug, Default)]
pub struct Scheme;
/// Authenticated user names; `*` is any.
#[derive(Debug, Default)]
pub struct User;
/// Group names.
#[derive(Debug, Default)]
pub struct Group;

fn token(item: &str) -> Result<String, String> {
    if !item.is_empty()
        && item
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
    {
        Ok(item.to_owned())
    } else {
        Err("not an HTTP method token".into())
    }
}

impl NameKind for Method {
    fn normalise(item: &str) -> Result<String, String> {
        token(item)
    }
}

impl NameKind for Scheme {
    fn normalise(item: &str) -> Result<String, String> {
        let lower = item.to_ascii_lowercase();
        let mut chars = lower.chars();
        let first_alpha = chars.next().is_some_and(|c| c.is_ascii_alphabetic());
        if first_alpha && chars.all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c)) {
            Ok(lower)
        } else {
            Err("not a URL scheme".into())
        }
    }
}

fn printable(item: &str, what: &str) -> Result<String, String> {
    if !item.is_empty() && !item.chars().any(|c| c.is_control() || c.is_whitespace()) {
        Ok(item.to_owned())
    } else {
        Err(format!(
            "not a {what} name (empty, or with spaces or control characters)"
        ))
    }
}

impl NameKind for User {
    fn normalise(item: &str) -> Result<String, String> {
        printable(item, "user")
    }
    const WILDCARD: bool = true;
}

impl NameKind for Group {
    fn normalise(item: &str) -> Result<String, String> {
        if item == "*" {
            return Err(
                "`*` is not a group (for any authenticated user, write user = [\"*\"])".into(),
            );
        }
        printable(item, "group")
    }
}

/// Sets of at most this many names are searched by comparing each.
const FEW: usize = 4;

/// A set of names of one kind.
#[derive(Debug, Default)]
pub struct NameSet<K> {
    names: HashSet<Box<str>, foldhash::fast::RandomState>,
    any: bool,
    kind: PhantomData<K>,
}

impl<K: NameKind> NameSet<K> {
    /// The names, for group lookups (each is asked of the group helper in turn).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.names.iter().map(|n| &**n)
    }
}

impl<K: NameKind> ItemSet for NameSet<K> {
    type Probe<'a> = &'a str;

    fn insert(&mut self, item: &str) -> Result<(), String> {
        if K::WILDCARD && item == "*" {
            self.any = true;
            return Ok(());
        }
        self.names.insert(K::normalise(item)?.into());
        Ok(())
    }

    fn contains(&self, name: &str) -> bool {
        self.any
            || if self.names.len() <= FEW {
                // A method list of a rule has one to four names: comparing them costs less
                // than hashing the probe.
                self.names.iter().any(|n| **n == *name)
            } else {
                self.names.contains(name)
            }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_check_their_items() {
        let mut m = NameSet::<Method>::default();
        m.insert("CONNECT").expect("token");
        assert!(m.contains("CONNECT") && !m.contains("connect"));
        assert!(m.insert("GET /").is_err());
        let mut s = NameSet::<Scheme>::default();
        s.insert("HTTP").expect("scheme");
        assert!(s.contains("http"));
        assert!(s.insert("1http").is_err());
        let mut u = NameSet::<User>::default();
        u.insert("alice@CORP").expect("user");
        assert!(u.contains("alice@CORP") && !u.contains("bob"));
        u.insert("*").expect("wildcard");
        assert!(u.contains("bob"));
        let mut g = NameSet::<Group>::default();
        assert!(g.insert("*").is_err(), "no wildcard for groups");
        assert!(g.insert("a b").is_err());
    }
}
