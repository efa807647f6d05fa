//! Why a rule list could not be compiled.

use std::path::PathBuf;

/// A rule that cannot be used, named by its position (1-based) and key.
#[derive(Debug, thiserror::Error)]
pub enum RuleError {
    /// An item of a rule is not valid for its key.
    #[error("rule {rule}, {key}: {reason}")]
    Item {
        /// The rule's position in its list, from 1.
        rule: usize,
        /// The matcher's key (`port`, `domain`, …).
        key: &'static str,
        /// What is wrong, naming the item.
        reason: String,
    },
    /// A named list file could not be read or has a bad line.
    #[error("list {name:?} ({}): {reason}", path.display())]
    List {
        /// The list's name.
        name: String,
        /// Its file.
        path: PathBuf,
        /// What is wrong (the I/O error, or the line number and item).
        reason: String,
    },
}
