//! A rendezvous between `lab run` processes that measure at the same time.
//!
//! `lab run --concurrent` starts one process per configuration, each in a network namespace of
//! its own, and they must begin each measured pass together: a configuration whose set-up takes
//! longer (a Summary Cache mesh waits for its peers' summaries) would otherwise drift a pass
//! ahead of the others, and the point of running them at once — that whatever the machine does
//! during a pass touches every configuration alike — would be lost.
//!
//! The processes share no namespace but share the file system: before pass `n`, each party
//! creates `DIR/n.PARTY` and waits until the directory holds one such file per party. A party
//! with no passes left (its configuration runs for fewer products) leaves `DIR/done.PARTY`,
//! which counts as arriving at every later pass. A party that died never arrives; the others go
//! on after the timeout, with a warning.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Environment variable naming the rendezvous directory.
pub const DIR_VAR: &str = "MESHCACHE_LAB_BARRIER";
/// Environment variable naming this party (a file-name-safe slug).
pub const PARTY_VAR: &str = "MESHCACHE_LAB_PARTY";
/// Environment variable giving the number of parties.
pub const PARTIES_VAR: &str = "MESHCACHE_LAB_PARTIES";

/// How long a party waits for the others before it measures alone.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// One party's view of the rendezvous.
#[derive(Clone, Debug)]
pub struct Barrier {
    dir: PathBuf,
    party: String,
    parties: usize,
    timeout: Duration,
}

impl Barrier {
    /// A rendezvous of `parties` parties in `dir`, as `party`.
    pub fn new(dir: impl Into<PathBuf>, party: &str, parties: usize, timeout: Duration) -> Self {
        Barrier {
            dir: dir.into(),
            party: party.to_string(),
            parties,
            timeout,
        }
    }

    /// The rendezvous the environment describes (all three variables set), if any.
    pub fn from_env() -> Result<Option<Barrier>, String> {
        Barrier::from_values(
            std::env::var_os(DIR_VAR).map(PathBuf::from),
            std::env::var(PARTY_VAR).ok(),
            std::env::var(PARTIES_VAR).ok(),
        )
    }

    fn from_values(
        dir: Option<PathBuf>,
        party: Option<String>,
        parties: Option<String>,
    ) -> Result<Option<Barrier>, String> {
        let (Some(dir), Some(party), Some(parties)) = (dir, party, parties) else {
            return Ok(None);
        };
        let parties: usize = parties
            .parse()
            .ok()
            .filter(|&n| n >= 1)
            .ok_or_else(|| format!("{PARTIES_VAR}={parties:?} is not a number of parties"))?;
        if party.is_empty() || party.contains(['/', '\0']) {
            return Err(format!("{PARTY_VAR}={party:?} is not a file name"));
        }
        Ok(Some(Barrier::new(dir, &party, parties, DEFAULT_TIMEOUT)))
    }

    /// Arrives at pass `pass` and waits for the other parties. Returns false when they did not
    /// all arrive within the timeout (the caller then measures anyway).
    pub async fn wait(&self, pass: usize) -> std::io::Result<bool> {
        std::fs::create_dir_all(&self.dir)?;
        std::fs::write(self.dir.join(format!("{pass}.{}", self.party)), b"")?;
        let deadline = Instant::now() + self.timeout;
        loop {
            if arrived(&self.dir, pass)? >= self.parties {
                return Ok(true);
            }
            if Instant::now() >= deadline {
                return Ok(false);
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Leaves the rendezvous: this party has no passes left, and nobody waits for it.
    pub fn retire(&self) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        std::fs::write(self.dir.join(format!("done.{}", self.party)), b"")
    }

    /// The number of parties.
    pub fn parties(&self) -> usize {
        self.parties
    }
}

/// How many parties arrived at `pass`, or left the rendezvous.
fn arrived(dir: &Path, pass: usize) -> std::io::Result<usize> {
    let prefix = format!("{pass}.");
    let mut n = 0;
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(&prefix) || name.starts_with("done.") {
            n += 1;
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn parties_leave_together_and_passes_are_kept_apart() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = Barrier::new(dir.path(), "a", 2, Duration::from_secs(5));
        let b = Barrier::new(dir.path(), "b", 2, Duration::from_secs(5));
        let started = Instant::now();
        let late_b = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            b.wait(0).await
        };
        let (ra, rb) = tokio::join!(a.wait(0), late_b);
        assert!(ra.expect("a") && rb.expect("b"));
        assert!(
            started.elapsed() >= Duration::from_millis(100),
            "a waited for b"
        );
        // Pass 0's files do not count for pass 1.
        let alone = Barrier::new(dir.path(), "a", 2, Duration::from_millis(50));
        assert!(!alone.wait(1).await.expect("a"), "b never came to pass 1");
        // A party with no passes left is not waited for.
        b.retire().expect("retire");
        assert!(alone.wait(2).await.expect("a"), "b retired");
    }

    #[test]
    fn a_rendezvous_needs_all_three_values() {
        let v = |s: &str| Some(s.to_string());
        let dir = || Some(PathBuf::from("rendezvous"));
        assert!(Barrier::from_values(None, v("a"), v("2"))
            .expect("ok")
            .is_none());
        assert!(Barrier::from_values(dir(), None, v("2"))
            .expect("ok")
            .is_none());
        let b = Barrier::from_values(dir(), v("a"), v("2"))
            .expect("ok")
            .expect("some");
        assert_eq!(b.parties(), 2);
        assert!(Barrier::from_values(dir(), v("a"), v("0")).is_err());
        assert!(Barrier::from_values(dir(), v("a"), v("two")).is_err());
        assert!(Barrier::from_values(dir(), v("a/b"), v("2")).is_err());
        assert!(Barrier::from_values(dir(), v(""), v("2")).is_err());
    }
}
