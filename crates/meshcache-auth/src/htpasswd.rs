//! htpasswd files: parsing, hash verification, and reloading when the file changes.
//!
//! A line is `user:hash`, as Apache's `htpasswd` writes it; fields after a second colon are
//! ignored, blank lines and lines starting with `#` are skipped (as Apache and Squid's
//! `basic_ncsa_auth` do). When a user appears twice the first line counts, as in Apache.
//!
//! Hashes understood ([`PasswordHash`]):
//!
//! | written by | looks like | how it is checked |
//! | --- | --- | --- |
//! | `htpasswd -B` | `$2y$05$…` (also `$2a$`, `$2b$`) | bcrypt, by the `bcrypt` crate, constant-time |
//! | `htpasswd -s` | `{SHA}` + base64 SHA-1 | SHA-1, constant-time comparison |
//! | `htpasswd -m` (its default) | `$apr1$salt$…` | Apache's MD5 scheme, [`md5_crypt`], constant-time |
//! | `openssl passwd -1` | `$1$salt$…` | the same scheme with the `$1$` magic |
//!
//! Everything else — DES `crypt` (`htpasswd -d`), `$5$`/`$6$` SHA-crypt, plain text — is
//! loaded as [`PasswordHash::Unsupported`]: the file still loads, that user is rejected, and
//! the load logs a warning naming the user and line (never the hash).
//!
//! [`HtpasswdFile`] holds the parsed table and reloads it when the file's size, modification
//! time or inode changes, looking at most once a second. A file that cannot be read or has gone
//! (an editor replacing it) keeps the last good table until a good one is there again.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use md5::{Digest as _, Md5};
use parking_lot::{Mutex, RwLock};
use subtle::ConstantTimeEq as _;

use crate::error::AuthError;

/// How often the file's metadata is looked at.
pub const RELOAD_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// The most bcrypt rounds (as a power of two) a hash may ask for: cost 17 takes seconds per
/// check; a higher one is taken for a typo rather than tied up a core for minutes.
pub const MAX_BCRYPT_COST: u32 = 17;

/// One user's stored password hash. Its `Debug` names the scheme only: a hash is no password,
/// but it is what an offline guesser needs, so it stays out of logs.
#[derive(Clone, PartialEq, Eq)]
pub enum PasswordHash {
    /// bcrypt (`$2y$`, `$2a$`, `$2b$`): the whole 60-character hash.
    Bcrypt(String),
    /// `{SHA}`: the SHA-1 digest of the password.
    Sha1([u8; 20]),
    /// Apache's `$apr1$` or the `$1$` of md5-crypt: the whole stored string.
    Md5Crypt(String),
    /// A format this crate does not check; the text names it.
    Unsupported(&'static str),
}

impl std::fmt::Debug for PasswordHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PasswordHash::Bcrypt(_) => f.write_str("Bcrypt(..)"),
            PasswordHash::Sha1(_) => f.write_str("Sha1(..)"),
            PasswordHash::Md5Crypt(_) => f.write_str("Md5Crypt(..)"),
            PasswordHash::Unsupported(what) => write!(f, "Unsupported({what:?})"),
        }
    }
}

impl PasswordHash {
    /// Recognises a hash field. Never fails: what is not understood is
    /// [`PasswordHash::Unsupported`].
    pub fn parse(field: &str) -> PasswordHash {
        if let Some(b64) = field.strip_prefix("{SHA}") {
            let digest = STANDARD
                .decode(b64)
                .ok()
                .and_then(|d| <[u8; 20]>::try_from(d).ok());
            return match digest {
                Some(digest) => PasswordHash::Sha1(digest),
                None => PasswordHash::Unsupported("{SHA} that is not a base64 SHA-1 digest"),
            };
        }
        if ["$2y$", "$2a$", "$2b$"]
            .iter()
            .any(|p| field.starts_with(p))
        {
            let cost = field.get(4..6).and_then(|c| c.parse::<u32>().ok());
            return match cost {
                _ if field.len() != 60 || !field.is_ascii() => {
                    PasswordHash::Unsupported("bcrypt hash of the wrong length")
                }
                Some(cost) if (4..=MAX_BCRYPT_COST).contains(&cost) => {
                    PasswordHash::Bcrypt(field.to_owned())
                }
                _ => PasswordHash::Unsupported("bcrypt cost outside 4..=17"),
            };
        }
        for magic in [APR1_MAGIC, MD5_MAGIC] {
            if let Some(rest) = field.strip_prefix(magic) {
                return match rest.split_once('$') {
                    Some((salt, hash))
                        if salt.len() <= 8
                            && hash.len() == 22
                            && !salt.is_empty()
                            && field.is_ascii() =>
                    {
                        PasswordHash::Md5Crypt(field.to_owned())
                    }
                    _ => PasswordHash::Unsupported("malformed MD5 crypt hash"),
                };
            }
        }
        PasswordHash::Unsupported(match field.as_bytes() {
            [b'$', b'5', b'$', ..] => "SHA-256 crypt ($5$)",
            [b'$', b'6', b'$', ..] => "SHA-512 crypt ($6$)",
            [b'$', b'y', b'$', ..] => "yescrypt ($y$)",
            [b'$', ..] => "unknown crypt scheme",
            f if f.len() == 13 => "DES crypt",
            _ => "plain text or unknown format",
        })
    }

    /// Whether `password` matches. Constant-time in the comparison for every scheme.
    pub fn verify(&self, password: &str) -> bool {
        match self {
            PasswordHash::Bcrypt(hash) => bcrypt::verify(password, hash).unwrap_or(false),
            PasswordHash::Sha1(digest) => {
                let computed = sha1::Sha1::digest(password.as_bytes());
                computed.as_slice().ct_eq(digest).into()
            }
            PasswordHash::Md5Crypt(stored) => {
                let (magic, rest) = match stored.strip_prefix(APR1_MAGIC) {
                    Some(rest) => (APR1_MAGIC, rest),
                    None => (MD5_MAGIC, stored.get(MD5_MAGIC.len()..).unwrap_or("")),
                };
                let salt = rest.split('$').next().unwrap_or("");
                let computed = md5_crypt(password.as_bytes(), magic, salt);
                computed.as_bytes().ct_eq(stored.as_bytes()).into()
            }
            PasswordHash::Unsupported(_) => false,
        }
    }

    /// Whether checking costs much CPU (bcrypt's rounds, md5-crypt's 1,000 MD5s), so it should
    /// run off the async threads.
    pub fn is_expensive(&self) -> bool {
        matches!(self, PasswordHash::Bcrypt(_) | PasswordHash::Md5Crypt(_))
    }
}

/// What one line of an htpasswd file holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParsedLine<'a> {
    /// Blank or a comment.
    Skip,
    /// A user and the hash field.
    Entry {
        /// The user name.
        user: &'a str,
        /// The hash field, unparsed.
        hash: &'a str,
    },
    /// Not `user:hash`; the text says why.
    Invalid(&'static str),
}

/// Splits one line (without its line end; a trailing CR is ignored).
pub fn parse_line(line: &str) -> ParsedLine<'_> {
    let line = line.strip_suffix('\r').unwrap_or(line);
    if line.is_empty() || line.starts_with(['#', ' ', '\t']) {
        return ParsedLine::Skip;
    }
    let Some((user, rest)) = line.split_once(':') else {
        return ParsedLine::Invalid("no colon after the user name");
    };
    let hash = rest.split(':').next().unwrap_or(rest);
    if user.is_empty() {
        return ParsedLine::Invalid("empty user name");
    }
    if hash.is_empty() {
        return ParsedLine::Invalid("empty password hash");
    }
    ParsedLine::Entry { user, hash }
}

const APR1_MAGIC: &str = "$apr1$";
const MD5_MAGIC: &str = "$1$";

/// The MD5-based crypt of Poul-Henning Kamp's FreeBSD `crypt`, which Apache adopted with the
/// magic `$apr1$` (`htpasswd -m`) and glibc with `$1$`: 1,000 rounds of MD5 over password and
/// salt, written in crypt's base64. Returns `magic salt $ hash`. `salt` is cut at 8 bytes.
///
/// Checked against `htpasswd -nbm` and `openssl passwd -1` output in the tests.
pub fn md5_crypt(password: &[u8], magic: &str, salt: &str) -> String {
    let salt = &salt.as_bytes()[..salt.len().min(8)];
    let alternate = Md5::new()
        .chain_update(password)
        .chain_update(salt)
        .chain_update(password)
        .finalize();
    let mut ctx = Md5::new()
        .chain_update(password)
        .chain_update(magic.as_bytes())
        .chain_update(salt);
    let mut left = password.len();
    while left > 0 {
        let n = left.min(16);
        ctx.update(&alternate[..n]);
        left -= n;
    }
    // The odd one: a zero byte for each 1 bit of the length, the password's first byte for
    // each 0 bit.
    let mut bits = password.len();
    while bits > 0 {
        if bits & 1 == 1 {
            ctx.update([0u8]);
        } else {
            ctx.update(&password[..1]);
        }
        bits >>= 1;
    }
    let mut digest = ctx.finalize();
    for round in 0..1000 {
        let mut ctx = Md5::new();
        if round % 2 == 1 {
            ctx.update(password);
        } else {
            ctx.update(digest);
        }
        if round % 3 != 0 {
            ctx.update(salt);
        }
        if round % 7 != 0 {
            ctx.update(password);
        }
        if round % 2 == 1 {
            ctx.update(digest);
        } else {
            ctx.update(password);
        }
        digest = ctx.finalize();
    }
    let d = digest;
    let mut out = String::with_capacity(magic.len() + salt.len() + 23);
    out.push_str(magic);
    out.extend(salt.iter().map(|&b| char::from(b)));
    out.push('$');
    for (a, b, c) in [(0, 6, 12), (1, 7, 13), (2, 8, 14), (3, 9, 15), (4, 10, 5)] {
        to64(
            &mut out,
            (u32::from(d[a]) << 16) | (u32::from(d[b]) << 8) | u32::from(d[c]),
            4,
        );
    }
    to64(&mut out, u32::from(d[11]), 2);
    out
}

/// crypt's base64: `./0-9A-Za-z`, least significant six bits first.
fn to64(out: &mut String, mut v: u32, n: usize) {
    const ALPHABET: &[u8; 64] = b"./0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    for _ in 0..n {
        out.push(char::from(ALPHABET[(v & 0x3f) as usize]));
        v >>= 6;
    }
}

/// The users of one file, parsed.
#[derive(Debug, Default)]
pub struct Table {
    users: HashMap<String, PasswordHash>,
}

impl Table {
    /// Parses a whole file's text, logging each line it skips as invalid (by number, never
    /// its content) and each user whose hash it cannot check.
    pub fn parse(text: &str, path: &Path) -> Table {
        let mut users = HashMap::new();
        for (number, line) in text.lines().enumerate() {
            let number = number + 1;
            match parse_line(line) {
                ParsedLine::Skip => {}
                ParsedLine::Invalid(why) => {
                    tracing::warn!(path = %path.display(), line = number, "htpasswd line skipped: {why}");
                }
                ParsedLine::Entry { user, hash } => {
                    if users.contains_key(user) {
                        tracing::warn!(path = %path.display(), line = number, user, "htpasswd user listed again; the first line counts");
                        continue;
                    }
                    let hash = PasswordHash::parse(hash);
                    if let PasswordHash::Unsupported(what) = hash {
                        tracing::warn!(path = %path.display(), line = number, user, "htpasswd hash not supported ({what}); use bcrypt (-B), {{SHA}} (-s) or $apr1$ (-m): the user is rejected");
                    }
                    users.insert(user.to_owned(), hash);
                }
            }
        }
        Table { users }
    }

    /// The hash of `user`, if listed.
    pub fn get(&self, user: &str) -> Option<&PasswordHash> {
        self.users.get(user)
    }

    /// How many users are listed.
    pub fn len(&self) -> usize {
        self.users.len()
    }

    /// Whether no user is listed.
    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }
}

/// What tells one version of the file from another.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Fingerprint {
    len: u64,
    modified: Option<SystemTime>,
    inode: u64,
}

impl Fingerprint {
    fn of(meta: &std::fs::Metadata) -> Fingerprint {
        #[cfg(unix)]
        let inode = std::os::unix::fs::MetadataExt::ino(meta);
        #[cfg(not(unix))]
        let inode = 0;
        Fingerprint {
            len: meta.len(),
            modified: meta.modified().ok(),
            inode,
        }
    }
}

/// Reads and parses the file; `None` when its fingerprint is still `known`.
fn load_if_changed(
    path: &Path,
    known: Option<Fingerprint>,
) -> std::io::Result<Option<(Fingerprint, Table)>> {
    let fingerprint = Fingerprint::of(&std::fs::metadata(path)?);
    if Some(fingerprint) == known {
        return Ok(None);
    }
    load(path, fingerprint).map(Some)
}

/// Reads and parses the file. The fingerprint is taken before reading: a change made while
/// reading shows as another change at the next look.
fn load(path: &Path, fingerprint: Fingerprint) -> std::io::Result<(Fingerprint, Table)> {
    let bytes = std::fs::read(path)?;
    let text = String::from_utf8_lossy(&bytes);
    Ok((fingerprint, Table::parse(&text, path)))
}

/// An htpasswd file, loaded, reloaded when it changes.
#[derive(Debug)]
pub struct HtpasswdFile {
    path: PathBuf,
    table: RwLock<Arc<Table>>,
    fingerprint: Mutex<Option<Fingerprint>>,
    /// Bumped on every reload; cached verdicts of an older generation are not used.
    generation: AtomicU64,
    /// When the metadata may next be looked at, in nanoseconds since `epoch`.
    next_check: AtomicU64,
    epoch: Instant,
    reloads: AtomicU64,
}

impl HtpasswdFile {
    /// Loads the file; fails when it cannot be read.
    pub fn open(path: &Path, now: Instant) -> Result<HtpasswdFile, AuthError> {
        let (fingerprint, table) = std::fs::metadata(path)
            .and_then(|meta| load(path, Fingerprint::of(&meta)))
            .map_err(|source| AuthError::Htpasswd {
                path: path.to_owned(),
                source,
            })?;
        tracing::info!(path = %path.display(), users = table.len(), "htpasswd file loaded");
        Ok(HtpasswdFile {
            path: path.to_owned(),
            table: RwLock::new(Arc::new(table)),
            fingerprint: Mutex::new(Some(fingerprint)),
            generation: AtomicU64::new(0),
            next_check: AtomicU64::new(nanos(RELOAD_CHECK_INTERVAL)),
            epoch: now,
            reloads: AtomicU64::new(0),
        })
    }

    /// The current table.
    pub fn table(&self) -> Arc<Table> {
        self.table.read().clone()
    }

    /// The current generation (0 for the table loaded at start, +1 per reload).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// How many times the file was reloaded.
    pub fn reloads(&self) -> u64 {
        self.reloads.load(Ordering::Relaxed)
    }

    /// Looks at the file if a second has passed since the last look, reloading it (off the
    /// async threads) if it changed. Returns the generation to check against. Of concurrent
    /// callers one looks; the others go on with the table they have.
    pub async fn refresh(&self, now: Instant) -> u64 {
        let now_ns = nanos(now.saturating_duration_since(self.epoch));
        let due = self.next_check.load(Ordering::Relaxed);
        if now_ns < due
            || self
                .next_check
                .compare_exchange(
                    due,
                    now_ns.saturating_add(nanos(RELOAD_CHECK_INTERVAL)),
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_err()
        {
            return self.generation();
        }
        let path = self.path.clone();
        let known = *self.fingerprint.lock();
        match tokio::task::spawn_blocking(move || load_if_changed(&path, known)).await {
            Ok(Ok(Some((fingerprint, table)))) => {
                tracing::info!(path = %self.path.display(), users = table.len(), "htpasswd file reloaded");
                *self.table.write() = Arc::new(table);
                *self.fingerprint.lock() = Some(fingerprint);
                self.reloads.fetch_add(1, Ordering::Relaxed);
                self.generation.fetch_add(1, Ordering::AcqRel);
            }
            Ok(Ok(None)) => {}
            Ok(Err(error)) => {
                tracing::warn!(path = %self.path.display(), %error, "htpasswd file unreadable; keeping the users loaded before");
            }
            Err(error) => {
                tracing::warn!(path = %self.path.display(), %error, "htpasswd reload task failed");
            }
        }
        self.generation()
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Lines produced on Debian 12 by `htpasswd -nbm u PASSWORD` (apache2-utils 2.4.x) and
    /// `openssl passwd -1 -salt saltsalt PASSWORD` (OpenSSL 3.0).
    const MD5_VECTORS: &[(&str, &str)] = &[
        ("apr1pass", "$apr1$kgjFln3Y$jXLN9OHMEqE2zse/uD9f60"),
        ("apr1pass", "$apr1$K19lvHUk$iFEjHcPHPqPfoMZg1F4o8."),
        ("", "$apr1$jqdfrlbd$4VzUM8QD7pg06NBoCD5H50"),
        ("a", "$apr1$PRTNqruz$VP3qZE4wP1DXcLf5/8U3s/"),
        (
            "pass word:with colon",
            "$apr1$8ZtmHUe/$Qw1Yuaj7daDeBaKE72uJ3/",
        ),
        ("ünïcödé", "$apr1$yVp/kK5q$NsONy9qPPr9ub1ZH5LB0/0"),
        (
            "0123456789abcdef0123456789",
            "$apr1$EJEyv79v$a0IzfhpeoDhbjZr3qdr4O0",
        ),
        ("secret", "$apr1$abcdefgh$h9FWgUz3n9YxylKLlR5SQ/"),
        ("md5pass", "$1$saltsalt$cCPENxTVtU4kpnV2ngztX0"),
        ("", "$1$saltsalt$5Jhcit4zN9UlGiA0txPkO0"),
        ("x", "$1$saltsalt$4px9i58NU2Z2/vZOUlGjq."),
    ];

    #[test]
    fn md5_crypt_matches_htpasswd_and_openssl() {
        for (password, stored) in MD5_VECTORS {
            let hash = PasswordHash::parse(stored);
            assert!(matches!(hash, PasswordHash::Md5Crypt(_)), "{stored}");
            assert!(hash.verify(password), "{password:?} against {stored}");
            assert!(!hash.verify("wrong"), "{stored}");
        }
    }

    #[test]
    fn sha1_and_bcrypt() {
        // `htpasswd -nbs u "pass word"` and `htpasswd -nbB -C 4 u "bcrypt pw"`.
        let sha = PasswordHash::parse("{SHA}2oguq15ANCGsJCWKX31fllwpyEk=");
        assert!(matches!(sha, PasswordHash::Sha1(_)));
        assert!(sha.verify("pass word"));
        assert!(!sha.verify("pass Word"));
        let bcrypt =
            PasswordHash::parse("$2y$04$uAiBeyQ.corUTi/JaO8xneNv/uUWCwrWtOPuyatObKXneBXkCBpvS");
        assert!(matches!(bcrypt, PasswordHash::Bcrypt(_)));
        assert!(bcrypt.verify("bcrypt pw"));
        assert!(!bcrypt.verify("bcrypt pW"));
    }

    #[test]
    fn unsupported_formats_reject() {
        for field in [
            "1TOD1wxw3xsHk",
            "$6$5C7uhzWUYugep8SL$uNRYQpD0y6xVYt66DiDBZdzvFIpyXmRegY5utNZQw1Rihz440bCwRfpwqaAYQphA7USJCLnCsqJv71W5Aam1s0",
            "plain",
            "{SHA}short",
            "$apr1$$",
            "$2y$04$short",
        ] {
            let hash = PasswordHash::parse(field);
            assert!(matches!(hash, PasswordHash::Unsupported(_)), "{field}");
            assert!(!hash.verify("plain"));
        }
    }

    #[test]
    fn lines() {
        assert_eq!(parse_line("# comment"), ParsedLine::Skip);
        assert_eq!(parse_line(""), ParsedLine::Skip);
        assert_eq!(parse_line("  indented:x"), ParsedLine::Skip);
        assert_eq!(
            parse_line("alice:{SHA}x:extra:fields\r"),
            ParsedLine::Entry {
                user: "alice",
                hash: "{SHA}x"
            }
        );
        assert!(matches!(parse_line("nocolon"), ParsedLine::Invalid(_)));
        assert!(matches!(parse_line(":hash"), ParsedLine::Invalid(_)));
        assert!(matches!(parse_line("user:"), ParsedLine::Invalid(_)));
    }

    #[test]
    fn first_line_of_a_user_counts() {
        let table = Table::parse(
            "a:{SHA}2oguq15ANCGsJCWKX31fllwpyEk=\na:$apr1$abcdefgh$h9FWgUz3n9YxylKLlR5SQ/\nbad\n",
            Path::new("test"),
        );
        assert_eq!(table.len(), 1);
        assert!(table.get("a").is_some_and(|h| h.verify("pass word")));
    }

    proptest! {
        #[test]
        fn line_parsing_never_panics(line in "\\PC{0,80}|[:$a-z0-9{}A-Z./]{0,80}") {
            if let ParsedLine::Entry { hash, .. } = parse_line(&line) {
                let parsed = PasswordHash::parse(hash);
                if !matches!(parsed, PasswordHash::Bcrypt(_)) {
                    let _ = parsed.verify("x");
                }
            }
        }

        #[test]
        fn md5_crypt_hashes_parse_back(password in "\\PC{0,20}", salt in "[./0-9A-Za-z]{1,8}") {
            let stored = md5_crypt(password.as_bytes(), APR1_MAGIC, &salt);
            let hash = PasswordHash::parse(&stored);
            prop_assert!(hash.verify(&password));
        }
    }
}
