//! The credential cache: recent verdicts kept for a TTL, so most checks cost a hash and a table
//! lookup instead of a helper round trip or a bcrypt.
//!
//! Passwords are never stored. A credential's key is SHA-256 over a per-process random secret
//! and the client's `Basic` token (base64 of `user:password`, taken as sent, so a cached check
//! decodes nothing) ([`Keyer`]): a memory dump shows neither the password nor a hash that could
//! be looked up in a table precomputed elsewhere. (Squid keeps the plain password in memory for
//! the same purpose.) The entry holds the verdict and the user name.
//!
//! [`TtlCache`] is the plain data structure, shared by credentials and group answers: bounded
//! to a number of entries, each with its own expiry; time is a parameter (`now`), never read
//! here. When full, an insert first drops the expired entries and, if that frees nothing, an
//! eighth of the table in the hash table's own order — arbitrary, so effectively random, and
//! cheap: a full table costs one sweep per eighth of its size in inserts.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::Instant;

use sha2::{Digest as _, Sha256};

use crate::error::AuthError;

/// A credential's key: SHA-256 of the secret and the credentials as the client sent them.
///
/// Hashed for the table by its first eight bytes: they are already uniform, and unpredictable
/// without the secret, so no attacker can aim many keys at one bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CredentialKey([u8; 32]);

impl Hash for CredentialKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        let mut first = [0u8; 8];
        first.copy_from_slice(&self.0[..8]);
        state.write_u64(u64::from_ne_bytes(first));
    }
}

/// Derives credential keys.
pub(crate) struct Keyer {
    secret: [u8; 32],
}

impl Keyer {
    /// A keyer with a fresh random secret.
    pub(crate) fn new() -> Result<Keyer, AuthError> {
        let mut secret = [0u8; 32];
        getrandom::fill(&mut secret).map_err(|e| AuthError::Entropy(e.to_string()))?;
        Ok(Keyer { secret })
    }

    /// The key of a `Basic` token (base64 of `user:password`, undecoded): the same
    /// credentials encoded differently (with or without padding) are two keys, which costs
    /// a cache miss and nothing else.
    pub(crate) fn key(&self, token: &[u8]) -> CredentialKey {
        CredentialKey(
            Sha256::new()
                .chain_update(self.secret)
                .chain_update(token)
                .finalize()
                .into(),
        )
    }
}

/// A bounded map whose entries expire.
#[derive(Debug)]
pub(crate) struct TtlCache<K, V> {
    map: HashMap<K, (V, Instant)>,
    max: usize,
}

impl<K: Hash + Eq, V: Clone> TtlCache<K, V> {
    /// Holds at most `max` entries (0: holds none).
    pub(crate) fn new(max: usize) -> Self {
        Self {
            map: HashMap::new(),
            max,
        }
    }

    /// The value under `key` if it has not expired at `now`.
    pub(crate) fn get<Q>(&self, key: &Q, now: Instant) -> Option<V>
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        match self.map.get(key) {
            Some((value, expires)) if now < *expires => Some(value.clone()),
            _ => None,
        }
    }

    /// Keeps `value` under `key` until `expires`.
    pub(crate) fn insert(&mut self, key: K, value: V, expires: Instant, now: Instant) {
        if self.max == 0 || expires <= now {
            return;
        }
        if self.map.len() >= self.max && !self.map.contains_key(&key) {
            self.map.retain(|_, (_, e)| now < *e);
            if self.map.len() >= self.max {
                let drop = self.max / 8 + 1;
                let mut seen = 0;
                self.map.retain(|_, _| {
                    seen += 1;
                    seen > drop
                });
            }
        }
        self.map.insert(key, (value, expires));
    }

    /// How many entries are held, expired ones included.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn entries_expire() {
        let t0 = Instant::now();
        let mut cache = TtlCache::new(10);
        cache.insert("a", 1, t0 + Duration::from_secs(5), t0);
        assert_eq!(cache.get("a", t0), Some(1));
        assert_eq!(cache.get("a", t0 + Duration::from_millis(4999)), Some(1));
        assert_eq!(cache.get("a", t0 + Duration::from_secs(5)), None);
        // Already expired, or a cache of size 0: nothing kept.
        cache.insert("b", 2, t0, t0);
        assert_eq!(cache.get("b", t0), None);
        let mut none = TtlCache::new(0);
        none.insert("a", 1, t0 + Duration::from_secs(5), t0);
        assert_eq!(none.len(), 0);
    }

    #[test]
    fn stays_bounded_and_drops_the_expired_first() {
        let t0 = Instant::now();
        let later = t0 + Duration::from_secs(60);
        let mut cache = TtlCache::new(100);
        for i in 0..50 {
            cache.insert(i, i, t0 + Duration::from_secs(1), t0);
        }
        for i in 50..100 {
            cache.insert(i, i, later + Duration::from_secs(60), t0);
        }
        // Full: the 50 expired entries go, the live ones stay.
        cache.insert(100, 100, later + Duration::from_secs(60), later);
        assert_eq!(cache.len(), 51);
        assert!((50..=100).all(|i| cache.get(&i, later) == Some(i)));
        for i in 101..10_000 {
            cache.insert(i, i, later + Duration::from_secs(60), later);
            assert!(cache.len() <= 100);
        }
        assert_eq!(cache.get(&9999, later), Some(9999));
    }

    #[test]
    fn keys_are_keyed() {
        let keyer = Keyer::new().expect("randomness");
        assert_eq!(keyer.key(b"dTpw"), keyer.key(b"dTpw"));
        assert_ne!(keyer.key(b"dTpw"), keyer.key(b"dTpx"));
        // Another process (another secret) derives other keys.
        assert_ne!(
            keyer.key(b"dTpw"),
            Keyer::new().expect("randomness").key(b"dTpw")
        );
    }
}
