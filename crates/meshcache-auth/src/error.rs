//! The crate's error type. [`BasicError`](crate::BasicError), what a malformed header value is,
//! stays apart: it belongs to the pure parser and ends as [`Verdict::Malformed`](crate::Verdict),
//! not as an error.

use std::path::PathBuf;

/// What went wrong configuring, starting or asking the authenticator.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// Neither `htpasswd` nor `helper` is set.
    #[error("auth: set `htpasswd` or `helper`")]
    NoBackend,
    /// Both `htpasswd` and `helper` are set.
    #[error("auth: set one of `htpasswd` and `helper`, not both")]
    BothBackends,
    /// A helper command line (`helper`, `group_helper`) is empty or starts with an empty program.
    #[error("auth: `{field}` needs a program to run (a non-empty command line)")]
    EmptyCommand {
        /// The config key.
        field: &'static str,
    },
    /// A config value out of its range.
    #[error("auth: `{field}` {reason}")]
    Invalid {
        /// The config key.
        field: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// [`Authenticator::start`](crate::Authenticator::start) was called outside a tokio runtime.
    #[error("auth: the helpers need a tokio runtime to run in")]
    NoRuntime,
    /// The htpasswd file could not be read at start-up.
    #[error("auth: cannot read the htpasswd file {path}: {source}")]
    Htpasswd {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A helper program could not be started.
    #[error("auth: cannot start helper `{program}`: {source}")]
    Spawn {
        /// The program (argv\[0\]).
        program: String,
        /// Why.
        source: std::io::Error,
    },
    /// The per-process secret of the credential cache could not be drawn from the OS.
    #[error("auth: no randomness from the OS for the credential cache: {0}")]
    Entropy(String),
    /// [`Authenticator::in_group`](crate::Authenticator::in_group) without a `group_helper`.
    #[error("auth: no `group_helper` is configured")]
    NoGroupHelper,
    /// A user or group name that is empty or holds a control character.
    #[error("auth: a user or group name is empty or holds a control character")]
    BadName,
    /// The helpers could not answer: all broken (`BH`), dying, or silent past the timeout,
    /// after the retries. Not cached; the next call asks again.
    #[error("auth: the {pool} helpers did not answer ({reason})")]
    Unavailable {
        /// `auth` or `group`.
        pool: &'static str,
        /// What happened on the last attempt.
        reason: HelperFailure,
    },
}

/// Why a helper request failed for good (after the retries).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HelperFailure {
    /// Answered `BH` (or something that is not the protocol) on every attempt.
    #[error("broken helper")]
    Broken,
    /// The helper died with the request on every attempt.
    #[error("helper died")]
    Died,
    /// No answer within `helper_timeout`, twice.
    #[error("timed out")]
    TimedOut,
    /// No helper was running (all restarting, backing off after crashes) within
    /// `helper_timeout`.
    #[error("no helper running")]
    NoneRunning,
    /// The overall deadline of a request passed (queued too long behind other requests).
    #[error("deadline passed")]
    Deadline,
    /// The authenticator is shutting down.
    #[error("shutting down")]
    ShuttingDown,
}
