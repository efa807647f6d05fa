//! # meshcache-auth
//!
//! Proxy authentication for meshcache: the `Proxy-Authorization: Basic` header checked against
//! an htpasswd file or through Squid's own authentication helpers, and group membership through
//! Squid's external ACL helpers — so a site moving from Squid keeps its password files, its
//! `auth_param basic program …` line and its group helpers as they are.
//!
//! ## For a newcomer
//!
//! A proxy that requires authentication answers `407 Proxy Authentication Required` with
//! `Proxy-Authenticate: Basic realm="…"` ([`Authenticator::challenge`]); the browser asks the
//! user and sends every request with `Proxy-Authorization: Basic base64(user:password)`. The
//! proxy hands that value to [`Authenticator::check`] and gets a [`Verdict`]:
//!
//! * [`Verdict::User`] — valid; the name goes to the access log and to user-based rules;
//! * [`Verdict::Rejected`] — wrong password or unknown user: answer 407 again;
//! * [`Verdict::Malformed`] — not Basic, not base64, no colon…: answer 407 (or 400);
//! * [`Verdict::Unavailable`] — the backend could not decide (helpers broken, hung, dying after
//!   the retries): answer 503 or deny, never let through.
//!
//! Two backends, one per configuration ([`AuthConfig`]):
//!
//! * **htpasswd file**: bcrypt, `{SHA}` and `$apr1$` hashes, as Apache's `htpasswd` writes them;
//!   the file is reloaded when it changes (looked at once a second at most).
//! * **Squid helper**: any program speaking Squid's basic auth helper protocol — Debian's
//!   `/usr/lib/squid/basic_ncsa_auth`, `basic_ldap_auth`, `basic_pam_auth` — run as a pool of
//!   `children` processes, optionally with `concurrency` channels each. A helper killed or
//!   crashed is restarted and the requests it held are sent to another; a hung one is killed
//!   after `helper_timeout` and the request retried once. No request waits forever.
//!
//! Checked credentials are remembered for `credentials_ttl` (rejections for `negative_ttl`), so
//! the common case — the next request of a logged-in user — costs a SHA-256 of the header's
//! token and a table lookup, nothing decoded (under a microsecond; `cargo bench -p
//! meshcache-auth`). Concurrent checks of the same
//! credentials share one verification. Passwords are never stored, only a keyed hash of them,
//! and never logged, nor is the header value.
//!
//! Measured on the 2-core KVM development machine (`cargo bench -p meshcache-auth`, medians,
//! noisy to ±10 %): a cached check 0.66 µs, of which 0.32 µs is the bench's own `block_on`
//! (so about 0.35 µs of work); uncached, an `$apr1$` hash 0.22 ms, bcrypt at `htpasswd -B`'s
//! cost 5 3.3 ms, a round trip through `basic_ncsa_auth` (apr1) 0.22 ms. 1,000 distinct users
//! through 5 `basic_ncsa_auth` children take about 0.5 s in the debug-built test.
//!
//! [`Authenticator::in_group`] asks a `group_helper` (Squid's external ACL protocol, e.g.
//! `/usr/lib/squid/ext_unix_group_acl -p`) whether a user is in a group, cached for `group_ttl`.
//!
//! ## Layout
//!
//! One idea per file:
//!
//! | file | what |
//! | --- | --- |
//! | `basic.rs` | [`parse_basic`]: the header value to user and password; pure, property-tested |
//! | `htpasswd.rs` | [`htpasswd`]: file lines, hash formats and their verification, reloading |
//! | `protocol.rs` | Squid's helper protocol on the wire: escaping, request lines, reply parsing; pure |
//! | `helper.rs` | the helper process pool: dispatch, channels, timeouts, restarts, retries |
//! | `cache.rs` | the TTL cache of verdicts and the keyed hash that stands in for passwords |
//! | `coalesce.rs` | concurrent checks of the same credentials share one verification |
//! | `config.rs` | [`AuthConfig`], its defaults (and why) and validation |
//! | `stats.rs`, `error.rs` | [`AuthStats`]; [`AuthError`] |
//! | `lib.rs` | [`Authenticator`], which ties them together |
//!
//! ## Dependencies, and why these
//!
//! * `bcrypt` (Keats): the most used bcrypt crate, maintained, verifies in constant time, reads
//!   `$2y$`/`$2a$`/`$2b$`.
//! * `md-5` (already in the workspace) for `$apr1$`, Apache's name for md5-crypt with another
//!   magic. `pwhash` has md5-crypt (`$1$`) but not `$apr1$`; the crates that have it are either
//!   built on the abandoned `rust-crypto` (`htpasswd-verify`) or young one-person 0.1 releases
//!   (`crypt3_rs`, `unix-crypt`). The scheme is 60 lines ([`htpasswd::md5_crypt`]), tested
//!   against vectors from the real `htpasswd -m` and `openssl passwd -1`, and Squid's own
//!   `basic_ncsa_auth` accepts the hashes it writes (an integration test).
//! * `sha1`, `sha2` (RustCrypto, the digest 0.10 line `md-5` is on): `{SHA}` hashes; the cache's
//!   keyed credential hash.
//! * `subtle`: constant-time comparison of computed and stored hashes.
//! * `base64`: Basic credentials and `{SHA}` hashes (the version `bcrypt` already pulls in).
//! * `getrandom`: the per-process secret of the cache keys (already pulled in by `bcrypt`).
//! * `tokio` with `process`: the helpers are child processes with piped stdio, killed on drop.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::Semaphore;

mod basic;
mod cache;
mod coalesce;
mod config;
mod error;
mod helper;
pub mod htpasswd;
mod protocol;
mod stats;

pub use basic::{basic_value, parse_basic, BasicError, MAX_VALUE_LEN};
pub use config::{AuthConfig, MAX_CHILDREN, MAX_CONCURRENCY};
pub use error::{AuthError, HelperFailure};
pub use stats::AuthStats;

use cache::{CredentialKey, Keyer, TtlCache};
use coalesce::Coalescer;
use helper::{Pool, PoolConfig};
use htpasswd::HtpasswdFile;
use protocol::{request_line, ResultCode};
use stats::Counters;

/// The longest request line sent to a helper. Squid's helpers read lines into buffers of about
/// 8 KiB (`HELPER_INPUT_BUFFER`); a longer line would be cut in two and put the helper out of
/// step. Credentials that escape to more are rejected without asking.
pub const MAX_HELPER_LINE: usize = 8000;

/// What [`Authenticator::check`] decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Valid credentials of this user.
    User(Arc<str>),
    /// Wrong password, or a user the backend does not know.
    Rejected {
        /// The user name the client sent.
        user: Arc<str>,
    },
    /// Not usable `Basic` credentials (another scheme, bad base64, no colon, …).
    Malformed,
    /// The backend could not decide: the helpers are broken, hung or dying, after the retries.
    Unavailable,
}

impl Verdict {
    /// The user name, for logs: the authenticated user, or the one that was rejected.
    pub fn user(&self) -> Option<&str> {
        match self {
            Verdict::User(user) | Verdict::Rejected { user } => Some(user),
            Verdict::Malformed | Verdict::Unavailable => None,
        }
    }
}

/// Checks proxy credentials; see the crate docs. Cheap to share behind an `Arc`; dropping it
/// (or [`Authenticator::shutdown`]) stops the helpers.
pub struct Authenticator {
    realm: String,
    challenge: String,
    backend: Backend,
    groups: Option<Pool>,
    keyer: Keyer,
    credentials: Mutex<TtlCache<CredentialKey, Cached>>,
    group_answers: Mutex<TtlCache<String, bool>>,
    inflight: Coalescer<CredentialKey, Outcome>,
    /// Bounds the bcrypt and md5-crypt verifications running at once on blocking threads.
    verify_permits: Semaphore,
    credentials_ttl: Duration,
    negative_ttl: Duration,
    group_ttl: Duration,
    counters: Arc<Counters>,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let backend = match &self.backend {
            Backend::Htpasswd(_) => "htpasswd",
            Backend::Helper(_) => "helper",
        };
        f.debug_struct("Authenticator")
            .field("realm", &self.realm)
            .field("backend", &backend)
            .field("group_helper", &self.groups.is_some())
            .finish_non_exhaustive()
    }
}

enum Backend {
    Htpasswd(HtpasswdFile),
    Helper(Pool),
}

/// A remembered verdict.
#[derive(Clone)]
struct Cached {
    user: Arc<str>,
    accepted: bool,
    /// The htpasswd generation it was decided under (0 with a helper).
    generation: u64,
}

/// A verification's result, shared by coalesced checks.
#[derive(Clone)]
enum Outcome {
    Accepted(Arc<str>),
    Rejected(Arc<str>),
    Unavailable,
}

impl Outcome {
    fn verdict(self) -> Verdict {
        match self {
            Outcome::Accepted(user) => Verdict::User(user),
            Outcome::Rejected(user) => Verdict::Rejected { user },
            Outcome::Unavailable => Verdict::Unavailable,
        }
    }
}

impl Authenticator {
    /// Validates `config`, loads the htpasswd file or starts the helper children (on the
    /// current tokio runtime), and the group helpers if configured.
    pub fn start(config: &AuthConfig) -> Result<Authenticator, AuthError> {
        config.validate()?;
        tokio::runtime::Handle::try_current().map_err(|_| AuthError::NoRuntime)?;
        let counters = Arc::new(Counters::default());
        let backend = match (&config.htpasswd, &config.helper) {
            (Some(path), None) => Backend::Htpasswd(HtpasswdFile::open(path, Instant::now())?),
            (None, Some(argv)) => Backend::Helper(Pool::start(
                PoolConfig {
                    name: "auth",
                    argv: argv.clone(),
                    children: config.children,
                    concurrency: config.concurrency,
                    timeout: config.helper_timeout,
                },
                counters.clone(),
            )?),
            (None, None) => return Err(AuthError::NoBackend),
            (Some(_), Some(_)) => return Err(AuthError::BothBackends),
        };
        let groups = match &config.group_helper {
            Some(argv) => Some(Pool::start(
                PoolConfig {
                    name: "group",
                    argv: argv.clone(),
                    children: config.group_children,
                    concurrency: config.group_concurrency,
                    timeout: config.helper_timeout,
                },
                counters.clone(),
            )?),
            None => None,
        };
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Ok(Authenticator {
            challenge: format!("Basic realm=\"{}\", charset=\"UTF-8\"", config.realm),
            realm: config.realm.clone(),
            backend,
            groups,
            keyer: Keyer::new()?,
            credentials: Mutex::new(TtlCache::new(config.max_cached)),
            group_answers: Mutex::new(TtlCache::new(config.max_cached)),
            inflight: Coalescer::new(),
            verify_permits: Semaphore::new(cores),
            credentials_ttl: config.credentials_ttl,
            negative_ttl: config.negative_ttl,
            group_ttl: config.group_ttl,
            counters,
        })
    }

    /// Checks one `Proxy-Authorization` header value.
    pub async fn check(&self, value: &[u8]) -> Verdict {
        Counters::bump(&self.counters.checks);
        let token = match basic::credentials(value) {
            Ok(token) => token,
            Err(error) => return self.malformed(&error),
        };
        let now = Instant::now();
        let generation = match &self.backend {
            Backend::Htpasswd(file) => file.refresh(now).await,
            Backend::Helper(_) => 0,
        };
        let key = self.keyer.key(token);
        let hit = self.credentials.lock().get(&key, now);
        if let Some(hit) = hit.filter(|hit| hit.generation == generation) {
            Counters::bump(&self.counters.cache_hits);
            let outcome = if hit.accepted {
                Outcome::Accepted(hit.user)
            } else {
                Outcome::Rejected(hit.user)
            };
            return self.counted(outcome.verdict());
        }
        let (user, password) = match basic::decode(token) {
            Ok(pair) => pair,
            Err(error) => return self.malformed(&error),
        };
        let outcome = self
            .inflight
            .run(key, || self.verify(key, user, password, generation))
            .await;
        self.counted(outcome.verdict())
    }

    fn malformed(&self, error: &BasicError) -> Verdict {
        Counters::bump(&self.counters.malformed);
        tracing::debug!(%error, "Proxy-Authorization not usable");
        Verdict::Malformed
    }

    fn counted(&self, verdict: Verdict) -> Verdict {
        Counters::bump(match verdict {
            Verdict::User(_) => &self.counters.accepted,
            Verdict::Rejected { .. } => &self.counters.rejected,
            Verdict::Malformed => &self.counters.malformed,
            Verdict::Unavailable => &self.counters.failures,
        });
        verdict
    }

    /// Asks the backend and remembers the answer.
    async fn verify(
        &self,
        key: CredentialKey,
        user: String,
        password: String,
        generation: u64,
    ) -> Outcome {
        Counters::bump(&self.counters.verifications);
        let user: Arc<str> = Arc::from(user);
        let outcome = match &self.backend {
            Backend::Htpasswd(file) => self.verify_file(file, &user, password).await,
            Backend::Helper(pool) => self.verify_helper(pool, &user, &password).await,
        };
        let remembered = match &outcome {
            Outcome::Accepted(_) => Some((true, self.credentials_ttl)),
            Outcome::Rejected(_) => Some((false, self.negative_ttl)),
            Outcome::Unavailable => None,
        };
        if let Some((accepted, ttl)) = remembered {
            let now = Instant::now();
            let cached = Cached {
                user,
                accepted,
                generation,
            };
            self.credentials
                .lock()
                .insert(key, cached, expiry(now, ttl), now);
        }
        outcome
    }

    async fn verify_file(&self, file: &HtpasswdFile, user: &Arc<str>, password: String) -> Outcome {
        let table = file.table();
        let Some(hash) = table.get(user).cloned() else {
            tracing::debug!(user = %user, "unknown user");
            return Outcome::Rejected(user.clone());
        };
        let valid = if hash.is_expensive() {
            let Ok(_permit) = self.verify_permits.acquire().await else {
                return Outcome::Unavailable;
            };
            match tokio::task::spawn_blocking(move || hash.verify(&password)).await {
                Ok(valid) => valid,
                Err(error) => {
                    tracing::warn!(%error, "password verification task failed");
                    return Outcome::Unavailable;
                }
            }
        } else {
            hash.verify(&password)
        };
        if valid {
            Outcome::Accepted(user.clone())
        } else {
            tracing::debug!(user = %user, "wrong password");
            Outcome::Rejected(user.clone())
        }
    }

    async fn verify_helper(&self, pool: &Pool, user: &Arc<str>, password: &str) -> Outcome {
        let line = request_line(&[&**user, password]);
        if line.len() > MAX_HELPER_LINE {
            tracing::debug!(user = %user, "credentials too long for a helper line; rejected");
            return Outcome::Rejected(user.clone());
        }
        match pool.request(&line).await {
            Ok(reply) if reply.result == ResultCode::Ok => Outcome::Accepted(user.clone()),
            Ok(reply) => {
                tracing::debug!(user = %user, reason = reply.message().unwrap_or(""), "helper rejected the credentials");
                Outcome::Rejected(user.clone())
            }
            Err(failure) => {
                tracing::warn!(user = %user, %failure, "auth helpers could not check the credentials");
                Outcome::Unavailable
            }
        }
    }

    /// Whether `user` is in `group`, asked of the group helper (Squid's external ACL protocol:
    /// `user group` in, `OK`/`ERR` out) and remembered for `group_ttl`. Errors: no group helper
    /// configured, a name that is empty or holds a control character, or the helpers could not
    /// answer (not remembered).
    pub async fn in_group(&self, user: &str, group: &str) -> Result<bool, AuthError> {
        Counters::bump(&self.counters.group_checks);
        let Some(pool) = &self.groups else {
            return Err(AuthError::NoGroupHelper);
        };
        let name_ok = |s: &str| !s.is_empty() && !s.chars().any(char::is_control);
        if !name_ok(user) || !name_ok(group) {
            return Err(AuthError::BadName);
        }
        // A line feed cannot be in either name, so it separates them unambiguously.
        let key = format!("{user}\n{group}");
        let now = Instant::now();
        let hit = self.group_answers.lock().get(key.as_str(), now);
        if let Some(member) = hit {
            Counters::bump(&self.counters.group_cache_hits);
            return Ok(member);
        }
        match pool.request(&request_line(&[user, group])).await {
            Ok(reply) => {
                let member = reply.result == ResultCode::Ok;
                let now = Instant::now();
                self.group_answers
                    .lock()
                    .insert(key, member, expiry(now, self.group_ttl), now);
                Ok(member)
            }
            Err(reason) => {
                Counters::bump(&self.counters.failures);
                tracing::warn!(user, group, %reason, "group helpers could not answer");
                Err(AuthError::Unavailable {
                    pool: "group",
                    reason,
                })
            }
        }
    }

    /// The configured realm.
    pub fn realm(&self) -> &str {
        &self.realm
    }

    /// The `Proxy-Authenticate` value of a 407: `Basic realm="…", charset="UTF-8"`.
    pub fn challenge(&self) -> &str {
        &self.challenge
    }

    /// The counters since start.
    pub fn stats(&self) -> AuthStats {
        let reloads = match &self.backend {
            Backend::Htpasswd(file) => file.reloads(),
            Backend::Helper(_) => 0,
        };
        self.counters.snapshot(reloads)
    }

    /// The pids of the running auth helper children (tests kill them).
    #[doc(hidden)]
    pub fn helper_pids(&self) -> Vec<u32> {
        match &self.backend {
            Backend::Helper(pool) => pool.pids().into_iter().filter(|&p| p != 0).collect(),
            Backend::Htpasswd(_) => Vec::new(),
        }
    }

    /// The pids of the running group helper children.
    #[doc(hidden)]
    pub fn group_helper_pids(&self) -> Vec<u32> {
        self.groups.as_ref().map_or_else(Vec::new, |pool| {
            pool.pids().into_iter().filter(|&p| p != 0).collect()
        })
    }

    /// Stops the helpers: kills the children and waits (a few seconds at most) for their tasks.
    /// Dropping the authenticator does the same without waiting.
    pub async fn shutdown(self) {
        if let Backend::Helper(pool) = self.backend {
            pool.shutdown().await;
        }
        if let Some(pool) = self.groups {
            pool.shutdown().await;
        }
    }
}

/// `now + ttl`, or a century on when that overflows.
fn expiry(now: Instant, ttl: Duration) -> Instant {
    now.checked_add(ttl)
        .or_else(|| now.checked_add(Duration::from_secs(100 * 365 * 86_400)))
        .unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The proxy shares one authenticator between connection tasks.
    #[test]
    fn shareable_between_tasks() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<Authenticator>();
        fn futures_are_send(auth: &Authenticator) {
            fn send<T: Send>(_: T) {}
            send(auth.check(b""));
            send(auth.in_group("u", "g"));
        }
        let _ = futures_are_send;
    }

    #[test]
    fn verdicts_name_their_user() {
        assert_eq!(Verdict::User("a".into()).user(), Some("a"));
        assert_eq!(Verdict::Rejected { user: "b".into() }.user(), Some("b"));
        assert_eq!(Verdict::Malformed.user(), None);
        assert_eq!(Verdict::Unavailable.user(), None);
    }
}
