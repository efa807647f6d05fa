//! The combinator every matcher shares: any plain item, and no negated one.
//!
//! `["a", "b"]` matches a or b; `["!a", "!b"]` matches anything but a and b; `["x", "!y"]`
//! matches x unless it is also y (which matters for sets: `[".example.com",
//! "!ads.example.com"]`). An item `@name` expands to the lines of a named list, and `!@name`
//! excludes all of them.

use crate::list::Lists;

/// A set of items of one kind, built one item at a time.
pub(crate) trait ItemSet: Default {
    /// What a request offers to the set.
    type Probe<'a>: Copy;
    /// Adds one item, as written; the error says what is wrong with it.
    fn insert(&mut self, item: &str) -> Result<(), String>;
    /// Called once all items are in (sorting, compiling).
    fn finish(&mut self) -> Result<(), String> {
        Ok(())
    }
    /// Whether the probe is in the set.
    fn contains(&self, probe: Self::Probe<'_>) -> bool;
}

/// A matcher: plain items and negated items of one kind.
#[derive(Debug)]
pub(crate) struct Items<S> {
    plain: Option<S>,
    negated: Option<S>,
}

/// Where an item came from, for error messages.
pub(crate) enum BuildError {
    /// An item written in the rule.
    Item(String),
    /// A named list: the list's error.
    List(crate::RuleError),
}

impl<S: ItemSet> Items<S> {
    /// Builds the matcher from a rule's items; `None` for an absent key.
    pub(crate) fn build(items: &[String], lists: &Lists) -> Result<Option<Self>, BuildError> {
        if items.is_empty() {
            return Ok(None);
        }
        let mut plain: Option<S> = None;
        let mut negated: Option<S> = None;
        for raw in items {
            let item = raw.trim();
            let (slot, item) = match item.strip_prefix('!') {
                Some(rest) => (&mut negated, rest.trim_start()),
                None => (&mut plain, item),
            };
            let set = slot.get_or_insert_with(S::default);
            if let Some(name) = item.strip_prefix('@') {
                let list = lists.get(name).ok_or_else(|| {
                    BuildError::Item(format!("{raw:?}: no list named {name:?} in [lists]"))
                })?;
                list.fill(set).map_err(BuildError::List)?;
            } else {
                set.insert(item)
                    .map_err(|e| BuildError::Item(format!("{raw:?}: {e}")))?;
            }
        }
        for set in [&mut plain, &mut negated].into_iter().flatten() {
            set.finish().map_err(BuildError::Item)?;
        }
        Ok(Some(Self { plain, negated }))
    }

    /// The plain and the negated items' sets.
    pub(crate) fn into_parts(self) -> (Option<S>, Option<S>) {
        (self.plain, self.negated)
    }

    /// The plain items, if any.
    pub(crate) fn plain(&self) -> Option<&S> {
        self.plain.as_ref()
    }

    /// The negated items, if any.
    pub(crate) fn negated(&self) -> Option<&S> {
        self.negated.as_ref()
    }

    /// Whether the probe matches: in a plain item (or there are none) and in no negated one.
    pub(crate) fn matches(&self, probe: S::Probe<'_>) -> bool {
        self.plain.as_ref().is_none_or(|s| s.contains(probe))
            && !self.negated.as_ref().is_some_and(|s| s.contains(probe))
    }
}
