//! Named lists: files of items, one a line, referred to as `@name` from any matcher.
//!
//! ```toml
//! [lists]
//! blocked = "/etc/meshcache/blocked-domains.txt"
//! ```
//! Blank lines and lines starting with `#` are skipped; a line may carry `!` like an item in a
//! rule. A file is read once per load of the config (a reload reads it again), and parsed as
//! the kind of item each matcher that names it expects.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::items::ItemSet;
use crate::RuleError;

/// One list, read.
#[derive(Debug)]
pub struct List {
    name: String,
    path: PathBuf,
    /// (line number, item) for each item line.
    items: Vec<(usize, String)>,
}

impl List {
    /// Parses a list's text.
    pub fn parse(name: &str, path: &Path, text: &str) -> Self {
        let items = text
            .lines()
            .enumerate()
            .map(|(i, line)| (i + 1, line.trim()))
            .filter(|(_, line)| !line.is_empty() && !line.starts_with('#'))
            .map(|(n, line)| (n, line.to_owned()))
            .collect();
        Self {
            name: name.to_owned(),
            path: path.to_owned(),
            items,
        }
    }

    /// How many items the list has.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether the list has no items.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Adds every item to `set`.
    pub(crate) fn fill<S: ItemSet>(&self, set: &mut S) -> Result<(), RuleError> {
        for (line, item) in &self.items {
            if item.starts_with('!') || item.starts_with('@') {
                return Err(self.error(format!(
                    "line {line}: {item:?}: a list's items cannot be negated or name other lists"
                )));
            }
            set.insert(item)
                .map_err(|e| self.error(format!("line {line}: {item:?}: {e}")))?;
        }
        Ok(())
    }

    fn error(&self, reason: String) -> RuleError {
        RuleError::List {
            name: self.name.clone(),
            path: self.path.clone(),
            reason,
        }
    }
}

/// Every named list of a config, read.
#[derive(Debug, Default)]
pub struct Lists {
    lists: BTreeMap<String, List>,
}

impl Lists {
    /// Reads each list's file.
    pub fn load(files: &BTreeMap<String, PathBuf>) -> Result<Self, RuleError> {
        let mut lists = BTreeMap::new();
        for (name, path) in files {
            let text = std::fs::read_to_string(path).map_err(|e| RuleError::List {
                name: name.clone(),
                path: path.clone(),
                reason: e.to_string(),
            })?;
            lists.insert(name.clone(), List::parse(name, path, &text));
        }
        Ok(Self { lists })
    }

    /// Lists given as text (tests, benchmarks).
    pub fn from_texts<'a>(texts: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        let lists = texts
            .into_iter()
            .map(|(name, text)| (name.to_owned(), List::parse(name, Path::new(name), text)))
            .collect();
        Self { lists }
    }

    /// The list called `name`.
    pub fn get(&self, name: &str) -> Option<&List> {
        self.lists.get(name)
    }
}
