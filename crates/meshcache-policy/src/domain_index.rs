//! Every `domain` matcher of a rule list in one table, so that a request's host is looked up
//! once, whatever the number of rules that name domains.
//!
//! Each plain or negated `domain` matcher of a rule becomes a set of the index ([`SetId`]). The
//! table has one entry per name written in any of them, holding which sets have it as an exact
//! name and which as a suffix (`.name`): a host costs at most one probe per label (each suffix
//! that starts after one of its dots, then the host itself), and the answer says at once which
//! sets hold it. Twenty rules naming domains, one of them a 100,000-entry list, cost what the list
//! alone does; a list named by several rules is stored once.
//!
//! Every suffix of a name has an entry as well (`tracker.example` and `example` for
//! `ads.tracker.example`), so a lookup probes the host's suffixes from its last label up and
//! stops at the first the table does not know: most hosts under no listed domain cost one or
//! two probes, however many labels they have.
//!
//! Entries store their memberships as numbers of interned bit patterns: the 100,000 names of
//! one list share one pattern, so an entry is its name and two `u32`.

use std::hash::BuildHasher;

use hashbrown::{HashMap, HashTable};

use crate::domain::DomainSet;

type Hasher = foldhash::fast::RandomState;

/// One set of the index: a plain or a negated `domain` matcher of one rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct SetId(u32);

/// A name and the sets that hold it.
#[derive(Debug)]
struct Entry {
    name: Box<str>,
    /// The pattern of the sets that have this exact name.
    exact: u32,
    /// The pattern of the sets that have this name as a suffix (it and every host under it).
    suffix: u32,
}

/// How a set holds a name.
#[derive(Clone, Copy)]
enum Kind {
    Exact,
    Suffix,
}

/// The domain sets of one rule list.
#[derive(Debug, Default)]
pub(crate) struct DomainIndex {
    hasher: Hasher,
    table: HashTable<Entry>,
    /// Bit patterns over the sets, each once; pattern 0 is the empty one.
    patterns: Vec<Box<[u64]>>,
    interned: HashMap<Box<[u64]>, u32, Hasher>,
    /// Pattern `p` with set `s` added: memoised, since a set's names mostly go from one
    /// pattern to the same next one.
    added: HashMap<(u32, SetId), u32, Hasher>,
    sets: u32,
}

/// Which sets of the index hold one host.
#[derive(Debug, Default)]
pub(crate) struct Hits {
    inline: [u64; INLINE],
    spill: Vec<u64>,
}

/// Sets whose membership fits in a [`Hits`] without allocating.
const INLINE: usize = 2;

impl Hits {
    fn add(&mut self, pattern: &[u64]) {
        for (i, word) in pattern.iter().enumerate() {
            match self.inline.get_mut(i) {
                Some(w) => *w |= word,
                None => {
                    let i = i - INLINE;
                    if self.spill.len() <= i {
                        self.spill.resize(i + 1, 0);
                    }
                    self.spill[i] |= word;
                }
            }
        }
    }

    fn holds(&self, set: SetId) -> bool {
        let (word, bit) = (set.0 as usize / 64, set.0 % 64);
        let word = match self.inline.get(word) {
            Some(w) => *w,
            None => self.spill.get(word - INLINE).copied().unwrap_or(0),
        };
        word >> bit & 1 == 1
    }
}

impl DomainIndex {
    /// Adds a set (its names move into the table) and says which it is.
    pub(crate) fn add(&mut self, set: DomainSet) -> SetId {
        if self.patterns.is_empty() {
            self.patterns.push(Box::new([]));
            self.interned.insert(Box::new([]), 0);
        }
        let id = SetId(self.sets);
        self.sets += 1;
        let (exact, suffix) = set.into_names();
        for name in exact {
            self.mark(name, id, Kind::Exact);
        }
        for name in suffix {
            self.mark(name, id, Kind::Suffix);
        }
        id
    }

    /// Adds `set` to `name`'s entry (made if new).
    fn mark(&mut self, name: Box<str>, set: SetId, kind: Kind) {
        let hash = self.hasher.hash_one(&*name);
        let pattern = |e: &Entry| match kind {
            Kind::Exact => e.exact,
            Kind::Suffix => e.suffix,
        };
        let now = self.table.find(hash, |e| e.name == name).map_or(0, pattern);
        let next = self.with(now, set);
        if let Some(e) = self.table.find_mut(hash, |e| e.name == name) {
            match kind {
                Kind::Exact => e.exact = next,
                Kind::Suffix => e.suffix = next,
            }
            return;
        }
        let (exact, suffix) = match kind {
            Kind::Exact => (next, 0),
            Kind::Suffix => (0, next),
        };
        // Every shorter suffix gets an entry too (with no set, if it is not a name itself): a
        // lookup that finds no entry for a suffix knows no longer name ends with it.
        for (i, b) in name.bytes().enumerate() {
            if b == b'.' {
                self.insert_if_absent(&name[i + 1..]);
            }
        }
        self.insert(hash, name, exact, suffix);
    }

    fn insert_if_absent(&mut self, name: &str) {
        let hash = self.hasher.hash_one(name);
        if self.table.find(hash, |e| &*e.name == name).is_none() {
            self.insert(hash, name.into(), 0, 0);
        }
    }

    fn insert(&mut self, hash: u64, name: Box<str>, exact: u32, suffix: u32) {
        let hasher = &self.hasher;
        self.table.insert_unique(
            hash,
            Entry {
                name,
                exact,
                suffix,
            },
            |e| hasher.hash_one(&*e.name),
        );
    }

    /// Pattern `pattern` with `set` added.
    fn with(&mut self, pattern: u32, set: SetId) -> u32 {
        if let Some(&p) = self.added.get(&(pattern, set)) {
            return p;
        }
        let mut bits = self.patterns[pattern as usize].to_vec();
        let word = set.0 as usize / 64;
        if bits.len() <= word {
            bits.resize(word + 1, 0);
        }
        bits[word] |= 1 << (set.0 % 64);
        let bits: Box<[u64]> = bits.into();
        let next = match self.interned.get(&bits) {
            Some(&p) => p,
            None => {
                let p = self.patterns.len() as u32;
                self.patterns.push(bits.clone());
                self.interned.insert(bits, p);
                p
            }
        };
        self.added.insert((pattern, set), next);
        next
    }

    fn find(&self, name: &str) -> Option<&Entry> {
        self.table
            .find(self.hasher.hash_one(name), |e| &*e.name == name)
    }

    /// Which sets hold `host` (lower-case, as the proxy keeps hosts; a final dot is ignored).
    ///
    /// Its suffixes are probed from the shortest (the last label) to the host itself, and the
    /// first one the table does not know ends the search: every suffix of a name has an entry,
    /// so no name ends with it. A host under no listed domain usually costs one or two probes.
    pub(crate) fn lookup(&self, host: &str) -> Hits {
        let mut hits = Hits::default();
        if self.table.is_empty() {
            return hits;
        }
        let host = host.strip_suffix('.').unwrap_or(host);
        let dots = host.bytes().enumerate().rev().filter(|&(_, b)| b == b'.');
        for start in dots.map(|(i, _)| i + 1).chain([0]) {
            let Some(e) = self.find(&host[start..]) else {
                break;
            };
            hits.add(&self.patterns[e.suffix as usize]);
            if start == 0 {
                hits.add(&self.patterns[e.exact as usize]);
            }
        }
        hits
    }

    /// How many names the table holds.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.table.len()
    }
}

/// A request's host against an index, looked up the first time a rule asks.
pub(crate) struct HostProbe<'a> {
    index: &'a DomainIndex,
    host: &'a str,
    hits: Option<Hits>,
}

impl<'a> HostProbe<'a> {
    pub(crate) fn new(index: &'a DomainIndex, host: &'a str) -> Self {
        Self {
            index,
            host,
            hits: None,
        }
    }

    /// Whether `set` holds the host.
    pub(crate) fn in_set(&mut self, set: SetId) -> bool {
        let (index, host) = (self.index, self.host);
        self.hits
            .get_or_insert_with(|| index.lookup(host))
            .holds(set)
    }
}

/// A rule's `domain` matcher: the host in its plain set (if it has one) and not in its negated
/// one.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DomainMatcher {
    pub(crate) plain: Option<SetId>,
    pub(crate) negated: Option<SetId>,
}

impl DomainMatcher {
    pub(crate) fn matches(&self, host: &mut HostProbe<'_>) -> bool {
        self.plain.is_none_or(|s| host.in_set(s)) && !self.negated.is_some_and(|s| host.in_set(s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::items::ItemSet;

    fn set(items: &[&str]) -> DomainSet {
        let mut s = DomainSet::default();
        for i in items {
            let _ = s.insert(i);
        }
        s
    }

    #[test]
    fn one_lookup_answers_for_every_set() {
        let mut index = DomainIndex::default();
        let a = index.add(set(&["example.com", ".ads.example"]));
        let b = index.add(set(&[".example.com"]));
        let c = index.add(set(&["other.org"]));
        // example.com is one entry for two sets; com, example and org are there for lookups.
        assert_eq!(index.len(), 6);
        let hits = index.lookup("example.com");
        assert!(hits.holds(a) && hits.holds(b) && !hits.holds(c));
        let hits = index.lookup("www.example.com.");
        assert!(!hits.holds(a) && hits.holds(b) && !hits.holds(c));
        let hits = index.lookup("x.ads.example");
        assert!(hits.holds(a) && !hits.holds(b));
        assert!(!index.lookup("badexample.com").holds(b));
    }

    #[test]
    fn sets_beyond_the_inline_words_are_answered() {
        let mut index = DomainIndex::default();
        let ids: Vec<SetId> = (0..200)
            .map(|i| index.add(set(&[&format!(".d{i}.example"), "shared.example"])))
            .collect();
        for (i, id) in ids.iter().enumerate() {
            let hits = index.lookup(&format!("www.d{i}.example"));
            assert!(hits.holds(*id), "set {i}");
            assert!(!hits.holds(ids[(i + 1) % ids.len()]), "set {i}'s neighbour");
            assert!(index.lookup("shared.example").holds(*id));
        }
        assert!(index.patterns.len() < 410, "patterns are shared");
    }

    proptest::proptest! {
        /// The index answers for each set exactly as the set alone does.
        #[test]
        fn the_index_agrees_with_each_set(
            sets in proptest::collection::vec(proptest::collection::vec("\\.?[a-c]{1,2}(\\.[a-c]{1,2}){0,2}", 0..6), 1..70),
            hosts in proptest::collection::vec("[a-c]{1,2}(\\.[a-c]{1,2}){0,3}\\.?", 1..20),
        ) {
            let mut index = DomainIndex::default();
            let ids: Vec<SetId> = sets.iter().map(|items| {
                let refs: Vec<&str> = items.iter().map(String::as_str).collect();
                index.add(set(&refs))
            }).collect();
            for host in &hosts {
                let hits = index.lookup(host);
                for (items, id) in sets.iter().zip(&ids) {
                    let refs: Vec<&str> = items.iter().map(String::as_str).collect();
                    proptest::prop_assert_eq!(hits.holds(*id), set(&refs).contains_host(host), "{} in {:?}", host, items);
                }
            }
        }
    }
}
