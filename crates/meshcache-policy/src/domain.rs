//! Host names, as Squid's `dstdomain`: `example.com` is that host only, `.example.com` is it and
//! every host under it.
//!
//! Two hash sets, one of exact names and one of suffixes; a lookup tries the host, then each
//! suffix that starts after one of its dots: as many probes as the host has labels, whatever
//! the size of the set (a 100,000-entry blocklist costs what a 10-entry one does).

use hashbrown::HashSet;

use crate::items::ItemSet;

type Set = HashSet<Box<str>, foldhash::fast::RandomState>;

/// A set of host names and domain suffixes.
#[derive(Debug, Default)]
pub struct DomainSet {
    exact: Set,
    /// Suffix items without their leading dot.
    suffix: Set,
}

impl DomainSet {
    /// The exact names and the suffixes (without their dot), for [`crate::domain_index`].
    pub(crate) fn into_names(
        self,
    ) -> (
        impl Iterator<Item = Box<str>>,
        impl Iterator<Item = Box<str>>,
    ) {
        (self.exact.into_iter(), self.suffix.into_iter())
    }

    /// Whether `host` (lower-case, as the proxy keeps hosts) is in the set.
    pub fn contains_host(&self, host: &str) -> bool {
        let host = host.strip_suffix('.').unwrap_or(host);
        if self.exact.contains(host) || self.suffix.contains(host) {
            return true;
        }
        if self.suffix.is_empty() {
            return false;
        }
        let bytes = host.as_bytes();
        (0..bytes.len())
            .filter(|&i| bytes[i] == b'.')
            .any(|i| self.suffix.contains(&host[i + 1..]))
    }
}

impl ItemSet for DomainSet {
    type Probe<'a> = &'a str;

    fn insert(&mut self, item: &str) -> Result<(), String> {
        let (suffix, name) = match item.strip_prefix('.') {
            Some(name) => (true, name),
            None => (false, item),
        };
        let name = name.strip_suffix('.').unwrap_or(name);
        if name.is_empty() {
            return Err("an empty host name".into());
        }
        if let Some(c) = name.chars().find(|c| {
            !(c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | ':' | '[' | ']'))
        }) {
            return Err(format!("{c:?} cannot be part of a host name"));
        }
        let name: Box<str> = name.to_ascii_lowercase().into();
        if suffix {
            self.suffix.insert(name);
        } else {
            self.exact.insert(name);
        }
        Ok(())
    }

    fn contains(&self, host: &str) -> bool {
        self.contains_host(host)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(items: &[&str]) -> DomainSet {
        let mut s = DomainSet::default();
        for i in items {
            s.insert(i).expect("valid item");
        }
        s
    }

    #[test]
    fn exact_names_match_only_themselves() {
        let s = set(&["example.com"]);
        assert!(s.contains_host("example.com"));
        assert!(s.contains_host("example.com."));
        assert!(!s.contains_host("www.example.com"));
        assert!(!s.contains_host("badexample.com"));
    }

    #[test]
    fn suffixes_match_the_domain_and_below() {
        let s = set(&[".Example.COM"]);
        assert!(s.contains_host("example.com"));
        assert!(s.contains_host("a.b.example.com"));
        assert!(!s.contains_host("badexample.com"));
        assert!(!s.contains_host("example.org"));
        assert!(!s.contains_host("com"));
    }

    #[test]
    fn bad_items_are_named() {
        let mut s = DomainSet::default();
        assert!(s.insert("").is_err());
        assert!(s.insert(".").is_err());
        assert!(s.insert("a b").is_err());
        assert!(s.insert("http://x").is_err());
    }

    proptest::proptest! {
        #[test]
        fn lookups_never_panic(items in proptest::collection::vec(".{0,20}", 0..8), host in ".{0,40}") {
            let mut s = DomainSet::default();
            for i in &items {
                let _ = s.insert(i);
            }
            let _ = s.contains_host(&host);
        }

        #[test]
        fn a_suffix_matches_every_subdomain(labels in proptest::collection::vec("[a-z0-9]{1,8}", 1..5), sub in "[a-z0-9]{1,8}") {
            let domain = labels.join(".");
            let s = set(&[&format!(".{domain}")]);
            proptest::prop_assert!(s.contains_host(&domain));
            let subdomain = format!("{sub}.{domain}");
            proptest::prop_assert!(s.contains_host(&subdomain));
            let glued = format!("{sub}{domain}");
            proptest::prop_assert!(!s.contains_host(&glued));
        }
    }
}
