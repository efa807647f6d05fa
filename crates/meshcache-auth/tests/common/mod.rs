//! What the integration tests share: finding Debian's Squid helpers and Apache's `htpasswd`,
//! writing password files with the real tool, killing a child by pid, and a time bound.
//!
//! `scripts/test.sh` installs the `squid` and `apache2-utils` packages. Without them the tests
//! that need them print a note and return (they are skipped, not failed).

#![allow(dead_code)]

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use meshcache_auth::AuthConfig;

/// Where Debian's squid package installs its helpers.
pub const SQUID_HELPERS: &str = "/usr/lib/squid";

/// Whether a missing tool skips its tests (`MESHCACHE_SKIP_INTEROP=1`) instead of failing
/// them, as in the rest of the suite: a green run must not hide a missing install step.
fn may_skip(what: &str) -> bool {
    let skip = std::env::var_os("MESHCACHE_SKIP_INTEROP").is_some_and(|v| v == "1");
    assert!(
        skip,
        "{what} is missing: scripts/test.sh installs it (MESHCACHE_SKIP_INTEROP=1 skips these tests)"
    );
    eprintln!("note: {what} is missing: test skipped (MESHCACHE_SKIP_INTEROP=1)");
    true
}

/// The path of a Squid helper; `None` (the test skipped) only with `MESHCACHE_SKIP_INTEROP=1`.
pub fn squid_helper(name: &str) -> Option<String> {
    let path = Path::new(SQUID_HELPERS).join(name);
    if path.exists() {
        Some(path.to_string_lossy().into_owned())
    } else {
        may_skip(&format!("{} (Debian's squid package)", path.display()));
        None
    }
}

/// Whether Apache's `htpasswd` runs; false (the test skipped) only with
/// `MESHCACHE_SKIP_INTEROP=1`.
pub fn have_htpasswd() -> bool {
    let ok = Command::new("htpasswd").arg("-h").output().is_ok();
    if !ok {
        may_skip("htpasswd (Debian's apache2-utils)");
    }
    ok
}

/// One `user:hash` line from `htpasswd -nb <flags> user password` (no newline).
pub fn htpasswd_line(flags: &[&str], user: &str, password: &str) -> String {
    let out = Command::new("htpasswd")
        .arg("-nb")
        .args(flags)
        .arg(user)
        .arg(password)
        .output()
        .expect("htpasswd runs");
    assert!(out.status.success(), "htpasswd failed: {out:?}");
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .trim()
        .to_owned()
}

/// Adds or changes a user in `file` with `htpasswd -b <flags> file user password` (`-c` creates).
pub fn htpasswd_set(file: &Path, flags: &[&str], user: &str, password: &str) {
    let out = Command::new("htpasswd")
        .args(flags)
        .arg("-b")
        .arg(file)
        .arg(user)
        .arg(password)
        .output()
        .expect("htpasswd runs");
    assert!(out.status.success(), "htpasswd failed: {out:?}");
}

/// A config with `helper` as the backend and short timeouts.
pub fn helper_config(argv: &[&str]) -> AuthConfig {
    AuthConfig {
        helper: Some(argv.iter().map(|s| s.to_string()).collect()),
        helper_timeout: Duration::from_secs(5),
        ..AuthConfig::default()
    }
}

/// A shell script run as a helper: `["/bin/sh", "-c", script]`.
pub fn sh(script: &str) -> Vec<String> {
    vec!["/bin/sh".into(), "-c".into(), script.into()]
}

/// SIGKILLs `pid` (with kill(1): the crate and its tests stay free of unsafe code).
pub fn kill9(pid: u32) {
    let status = Command::new("kill")
        .arg("-9")
        .arg(pid.to_string())
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill -9 {pid} failed");
}

/// Runs `test`, failing it if it takes longer than `limit`.
pub async fn bounded<F: Future>(limit: Duration, test: F) -> F::Output {
    tokio::time::timeout(limit, test)
        .await
        .unwrap_or_else(|_| panic!("test took longer than {limit:?}"))
}

/// A temporary directory that lives as long as the value.
pub fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().expect("temp dir")
}

/// `dir/name`.
pub fn path_in(dir: &tempfile::TempDir, name: &str) -> PathBuf {
    dir.path().join(name)
}
