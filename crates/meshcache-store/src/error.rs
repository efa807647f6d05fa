//! Error types.

use crate::Replacement;

/// Why [`MemoryStore::insert`](crate::MemoryStore::insert) refused a value.
///
/// A refused insert changes nothing in the store.
#[derive(thiserror::Error, Debug, PartialEq, Eq, Clone)]
pub enum AdmitError {
    /// The value weighs more than the store accepts: `max` is the smaller of
    /// the configured maximum object size and the store's capacity.
    #[error("object of {size} bytes exceeds the maximum object size of {max} bytes")]
    TooLarge {
        /// The value's weight in bytes.
        size: u64,
        /// The largest weight the store accepts.
        max: u64,
    },
}

/// A string that names no [`Replacement`] policy.
#[derive(thiserror::Error, Debug, PartialEq, Eq, Clone)]
#[error(
    "unknown replacement policy {value:?}: expected one of {}",
    Replacement::allowed()
)]
pub struct ParseReplacementError {
    /// The string that was given.
    pub value: String,
}
