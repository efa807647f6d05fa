//! The htpasswd backend against files written by Apache's real `htpasswd` (apache2-utils):
//! bcrypt (`-B`), SHA-1 (`-s`) and apr1 MD5 (`-m`) users, wrong passwords, unknown users,
//! malformed headers, the cache, and reloading when the file changes.

mod common;

use std::time::Duration;

use common::{bounded, have_htpasswd, htpasswd_set, path_in, tempdir};
use meshcache_auth::{basic_value, AuthConfig, Authenticator, Verdict};

async fn check(auth: &Authenticator, user: &str, password: &str) -> Verdict {
    auth.check(basic_value(user, password).as_bytes()).await
}

fn user(name: &str) -> Verdict {
    Verdict::User(name.into())
}

fn rejected(name: &str) -> Verdict {
    Verdict::Rejected { user: name.into() }
}

#[tokio::test]
async fn htpasswd_formats_check_and_reload() {
    if !have_htpasswd() {
        return;
    }
    bounded(Duration::from_secs(60), async {
        let dir = tempdir();
        let file = path_in(&dir, "passwords");
        htpasswd_set(&file, &["-c", "-B", "-C", "5"], "bea", "bcrypt secret");
        htpasswd_set(&file, &["-s"], "sam", "sha:secret");
        htpasswd_set(&file, &["-m"], "amy", "apr1 sécret");
        // DES crypt: loaded, but this crate does not check it: rejected, never accepted.
        htpasswd_set(&file, &["-d"], "des", "despass");

        let auth = Authenticator::start(&AuthConfig {
            htpasswd: Some(file.clone()),
            ..AuthConfig::default()
        })
        .expect("starts");
        assert_eq!(
            auth.challenge(),
            "Basic realm=\"meshcache proxy\", charset=\"UTF-8\""
        );

        assert_eq!(check(&auth, "bea", "bcrypt secret").await, user("bea"));
        assert_eq!(check(&auth, "sam", "sha:secret").await, user("sam"));
        assert_eq!(check(&auth, "amy", "apr1 sécret").await, user("amy"));
        assert_eq!(check(&auth, "bea", "bcrypt Secret").await, rejected("bea"));
        assert_eq!(check(&auth, "sam", "sha:").await, rejected("sam"));
        assert_eq!(check(&auth, "amy", "apr1 secret").await, rejected("amy"));
        assert_eq!(check(&auth, "des", "despass").await, rejected("des"));
        assert_eq!(check(&auth, "nobody", "x").await, rejected("nobody"));
        assert_eq!(auth.check(b"Basic !!!").await, Verdict::Malformed);
        assert_eq!(auth.check(b"Negotiate abc").await, Verdict::Malformed);

        // Again: from the cache, rejections included.
        let before = auth.stats();
        assert_eq!(check(&auth, "bea", "bcrypt secret").await, user("bea"));
        assert_eq!(check(&auth, "amy", "apr1 secret").await, rejected("amy"));
        let after = auth.stats();
        assert_eq!(after.cache_hits - before.cache_hits, 2);
        assert_eq!(after.checks, 12);
        assert_eq!(after.accepted, 4);
        assert_eq!(after.rejected, 6);
        assert_eq!(after.malformed, 2);
        assert_eq!(after.reloads, 0);

        // Change a password, add a user, remove one; the file is looked at once a second.
        tokio::time::sleep(Duration::from_millis(1100)).await;
        htpasswd_set(&file, &["-B", "-C", "5"], "bea", "new bcrypt secret");
        htpasswd_set(&file, &["-s"], "neo", "fresh");
        htpasswd_set(&file, &["-m"], "kit", "kit's");
        let status = std::process::Command::new("htpasswd")
            .arg("-D")
            .arg(&file)
            .arg("sam")
            .status()
            .expect("htpasswd -D");
        assert!(status.success());
        // Within about a second every check sees the new file.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while check(&auth, "neo", "fresh").await != user("neo") {
            assert!(tokio::time::Instant::now() < deadline, "file not reloaded");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(check(&auth, "bea", "new bcrypt secret").await, user("bea"));
        // The old password was cached as valid; the reload voids that.
        assert_eq!(check(&auth, "bea", "bcrypt secret").await, rejected("bea"));
        assert_eq!(check(&auth, "sam", "sha:secret").await, rejected("sam"));
        assert_eq!(check(&auth, "amy", "apr1 sécret").await, user("amy"));
        assert_eq!(auth.stats().reloads, 1);

        // The file gone (an editor's replace, half done): the users loaded stay.
        tokio::time::sleep(Duration::from_millis(1100)).await;
        std::fs::rename(&file, path_in(&dir, "aside")).expect("rename");
        tokio::time::sleep(Duration::from_millis(1100)).await;
        assert_eq!(check(&auth, "neo", "fresh").await, user("neo"));
        // Not cached yet: checked against the table kept.
        assert_eq!(check(&auth, "kit", "kit's").await, user("kit"));
        assert_eq!(auth.stats().reloads, 1);
        auth.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn concurrent_checks_of_one_user_share_one_bcrypt() {
    if !have_htpasswd() {
        return;
    }
    bounded(Duration::from_secs(60), async {
        let dir = tempdir();
        let file = path_in(&dir, "passwords");
        htpasswd_set(&file, &["-c", "-B", "-C", "10"], "bea", "slow");
        let auth = std::sync::Arc::new(
            Authenticator::start(&AuthConfig {
                htpasswd: Some(file),
                ..AuthConfig::default()
            })
            .expect("starts"),
        );
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..20 {
            let auth = auth.clone();
            tasks.spawn(async move { auth.check(basic_value("bea", "slow").as_bytes()).await });
        }
        while let Some(verdict) = tasks.join_next().await {
            assert_eq!(verdict.expect("task"), user("bea"));
        }
        let stats = auth.stats();
        // One bcrypt ran; the other 19 waited for it (or, arriving after, hit the cache).
        assert_eq!(stats.accepted, 20);
        assert_eq!(stats.checks, 20);
        assert_eq!(stats.verifications, 1);
    })
    .await;
}

#[test]
fn start_outside_a_runtime_or_without_the_file_fails_cleanly() {
    let config = AuthConfig {
        htpasswd: Some("/nonexistent/passwords".into()),
        ..AuthConfig::default()
    };
    assert!(matches!(
        Authenticator::start(&config),
        Err(meshcache_auth::AuthError::NoRuntime)
    ));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        assert!(matches!(
            Authenticator::start(&config),
            Err(meshcache_auth::AuthError::Htpasswd { .. })
        ));
    });
}
