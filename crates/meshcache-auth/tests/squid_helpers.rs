//! Debian's real Squid helpers plugged in unchanged: `basic_ncsa_auth` checking 1,000 distinct
//! users through 5 children, one of them SIGKILLed mid-run without a request failing, the same
//! helper misconfigured as concurrent, `helper-mux` making a one-at-a-time helper concurrent,
//! and `ext_unix_group_acl` answering group membership.
//!
//! The password file's apr1 lines are written with this crate's `md5_crypt` (which unit tests
//! check against `htpasswd -m`), so here `basic_ncsa_auth`'s own MD5 code checks them once more;
//! one bcrypt user comes from the real `htpasswd -B`. Skipped with a note without squid.

mod common;

use std::io::Write as _;
use std::sync::Arc;
use std::time::Duration;

use common::{bounded, have_htpasswd, htpasswd_line, kill9, path_in, squid_helper, tempdir};
use meshcache_auth::htpasswd::md5_crypt;
use meshcache_auth::{basic_value, AuthConfig, AuthError, Authenticator, Verdict};
use tokio::task::JoinSet;

fn user_name(i: usize) -> String {
    format!("user{i:04}")
}

/// Passwords with a space, a percent sign and non-ASCII: the request line must escape them and
/// the helper unescape them.
fn password(i: usize) -> String {
    format!("pw {i}%ü")
}

/// Writes `n` apr1 users to `dir/passwords`.
fn users_file(dir: &tempfile::TempDir, n: usize) -> String {
    let path = path_in(dir, "passwords");
    let mut file = std::fs::File::create(&path).expect("create");
    for i in 0..n {
        let salt = format!("s{i:07}");
        let hash = md5_crypt(password(i).as_bytes(), "$apr1$", &salt);
        writeln!(file, "{}:{hash}", user_name(i)).expect("write");
    }
    if have_htpasswd() {
        writeln!(
            file,
            "{}",
            htpasswd_line(&["-B", "-C", "5"], "bea", "bcrypt pw")
        )
        .expect("write");
    }
    path.to_string_lossy().into_owned()
}

fn ncsa_config(ncsa: &str, file: &str) -> AuthConfig {
    AuthConfig {
        helper: Some(vec![ncsa.to_owned(), file.to_owned()]),
        children: 5,
        helper_timeout: Duration::from_secs(10),
        ..AuthConfig::default()
    }
}

/// Waits until all `n` children run.
async fn all_running(auth: &Authenticator, n: usize) -> Vec<u32> {
    loop {
        let pids = auth.helper_pids();
        if pids.len() == n {
            return pids;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Checks every `(user, password)` at once; returns the verdicts in order.
async fn check_all(auth: &Arc<Authenticator>, pairs: Vec<(String, String)>) -> Vec<Verdict> {
    let mut tasks = JoinSet::new();
    for (i, (user, password)) in pairs.into_iter().enumerate() {
        let auth = auth.clone();
        tasks.spawn(async move {
            (
                i,
                auth.check(basic_value(&user, &password).as_bytes()).await,
            )
        });
    }
    let mut verdicts = vec![Verdict::Malformed; tasks.len()];
    while let Some(done) = tasks.join_next().await {
        let (i, verdict) = done.expect("task");
        verdicts[i] = verdict;
    }
    verdicts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_ncsa_auth_checks_1000_users_through_5_children() {
    let Some(ncsa) = squid_helper("basic_ncsa_auth") else {
        return;
    };
    bounded(Duration::from_secs(120), async {
        let dir = tempdir();
        let file = users_file(&dir, 1000);
        let auth = Arc::new(Authenticator::start(&ncsa_config(&ncsa, &file)).expect("starts"));
        all_running(&auth, 5).await;

        let started = std::time::Instant::now();
        let good: Vec<_> = (0..1000).map(|i| (user_name(i), password(i))).collect();
        let verdicts = check_all(&auth, good.clone()).await;
        let elapsed = started.elapsed();
        for (i, verdict) in verdicts.iter().enumerate() {
            assert_eq!(verdict, &Verdict::User(user_name(i).into()), "user {i}");
        }
        let stats = auth.stats();
        eprintln!("1,000 distinct users through basic_ncsa_auth x5: {elapsed:?}; {stats:?}");
        assert_eq!(stats.failures, 0);
        assert_eq!(stats.helper_requests, 1000);
        assert_eq!(stats.helper_restarts, 0);

        // Wrong passwords and unknown users.
        let wrong: Vec<_> = (0..100)
            .map(|i| (user_name(i * 7), format!("{} ", password(i * 7))))
            .chain((0..20).map(|i| (format!("ghost{i}"), password(i))))
            .collect();
        for (verdict, (user, _)) in check_all(&auth, wrong.clone()).await.iter().zip(&wrong) {
            assert_eq!(
                verdict,
                &Verdict::Rejected {
                    user: user.as_str().into()
                }
            );
        }
        if have_htpasswd() {
            let bea = auth.check(basic_value("bea", "bcrypt pw").as_bytes()).await;
            assert_eq!(bea, Verdict::User("bea".into()), "bcrypt via libxcrypt");
        }

        // All again: from the cache, the helpers not asked.
        let asked = auth.stats().helper_requests;
        let verdicts = check_all(&auth, good).await;
        assert!(verdicts.iter().all(|v| matches!(v, Verdict::User(_))));
        let stats = auth.stats();
        assert_eq!(stats.helper_requests, asked);
        assert!(stats.cache_hits >= 1000);
        Arc::try_unwrap(auth).expect("sole owner").shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_helper_killed_mid_run_costs_no_request() {
    let Some(ncsa) = squid_helper("basic_ncsa_auth") else {
        return;
    };
    bounded(Duration::from_secs(120), async {
        let dir = tempdir();
        let file = users_file(&dir, 1000);
        // No cache: every check goes to a helper.
        let config = AuthConfig {
            credentials_ttl: Duration::ZERO,
            negative_ttl: Duration::ZERO,
            ..ncsa_config(&ncsa, &file)
        };
        let auth = Arc::new(Authenticator::start(&config).expect("starts"));
        let pids = all_running(&auth, 5).await;

        // Four rounds of the 1,000 users, each round all at once. (Concurrent checks of the
        // same credentials share one verification, so the rounds follow each other.)
        const ROUNDS: usize = 4;
        let pairs: Vec<_> = (0..1000).map(|i| (user_name(i), password(i))).collect();
        let run = tokio::spawn({
            let auth = auth.clone();
            async move {
                let mut verdicts = Vec::new();
                for _ in 0..ROUNDS {
                    verdicts.extend(check_all(&auth, pairs.clone()).await);
                }
                verdicts
            }
        });
        // In the second round, kill one child.
        while auth.stats().helper_requests < 1500 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let victim = pids[2];
        assert!(!run.is_finished(), "the run ended before the kill");
        kill9(victim);
        let at_kill = auth.stats().helper_requests;

        let verdicts = run.await.expect("run");
        assert_eq!(verdicts.len(), ROUNDS * 1000);
        for (i, verdict) in verdicts.iter().enumerate() {
            assert_eq!(
                verdict,
                &Verdict::User(user_name(i % 1000).into()),
                "check {i}"
            );
        }
        let stats = auth.stats();
        eprintln!("killed pid {victim} at {at_kill} helper requests: {stats:?}");
        // Every check asked a helper; the one the victim held was asked twice.
        assert!(stats.helper_requests >= (ROUNDS * 1000) as u64, "{stats:?}");
        assert_eq!(stats.failures, 0);
        assert_eq!(stats.accepted, (ROUNDS * 1000) as u64);
        assert!(stats.helper_restarts >= 1, "{stats:?}");
        // The slot runs a new child.
        let pids = all_running(&auth, 5).await;
        assert!(!pids.contains(&victim));
    })
    .await;
}

/// Squid's `helper-mux` (Perl) in front of a one-at-a-time helper, with `concurrency` 4.
///
/// The helper behind it is a shell script that writes each reply in one `write`. Not
/// `basic_ncsa_auth`: it writes `OK ` and the line end separately (its stdout is unbuffered),
/// and Squid 5.7's helper-mux forwards each read as a reply of its own, so its output comes
/// apart (`1 OK 3 OK `, then `1 `): the pair is broken in Squid too, whatever the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helper_mux_makes_a_one_at_a_time_helper_concurrent() {
    let Some(mux) = squid_helper("helper-mux") else {
        return;
    };
    bounded(Duration::from_secs(60), async {
        // helper-mux hands its arguments to a shell: a script file, not `sh -c`.
        let dir = tempdir();
        let helper = path_in(&dir, "helper.sh");
        std::fs::write(
            &helper,
            "#!/bin/sh\nwhile read -r u p; do if [ \"$p\" = \"pw-$u\" ]; then echo OK; else echo ERR; fi; done\n",
        )
        .expect("write");
        let mut permissions = std::fs::metadata(&helper).expect("stat").permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
        std::fs::set_permissions(&helper, permissions).expect("chmod");
        let auth = Arc::new(
            Authenticator::start(&AuthConfig {
                helper: Some(vec![mux, helper.to_string_lossy().into_owned()]),
                children: 2,
                concurrency: 4,
                ..AuthConfig::default()
            })
            .expect("starts"),
        );
        let pairs: Vec<_> = (0..200)
            .map(|i| {
                let user = user_name(i);
                let pw = if i % 5 == 0 {
                    "wrong".into()
                } else {
                    format!("pw-{user}")
                };
                (user, pw)
            })
            .collect();
        let verdicts = check_all(&auth, pairs).await;
        for (i, verdict) in verdicts.iter().enumerate() {
            let expected = if i % 5 == 0 {
                Verdict::Rejected {
                    user: user_name(i).into(),
                }
            } else {
                Verdict::User(user_name(i).into())
            };
            assert_eq!(verdict, &expected, "user {i}");
        }
        let stats = auth.stats();
        assert_eq!(stats.failures, 0);
        assert_eq!(stats.helper_requests, 200, "{stats:?}");
    })
    .await;
}

#[tokio::test]
async fn a_helper_without_concurrency_configured_with_it_is_unavailable_not_hung() {
    let Some(ncsa) = squid_helper("basic_ncsa_auth") else {
        return;
    };
    bounded(Duration::from_secs(30), async {
        let dir = tempdir();
        let file = users_file(&dir, 3);
        let auth = Authenticator::start(&AuthConfig {
            concurrency: 4,
            children: 2,
            helper_timeout: Duration::from_secs(2),
            ..ncsa_config(&ncsa, &file)
        })
        .expect("starts");
        // basic_ncsa_auth takes "0" for the user and answers without a channel-ID.
        let verdict = auth
            .check(basic_value(&user_name(1), &password(1)).as_bytes())
            .await;
        assert_eq!(verdict, Verdict::Unavailable);
        assert!(auth.stats().helper_errors >= 1);
    })
    .await;
}

#[tokio::test]
async fn ext_unix_group_acl_answers_membership() {
    let Some(group_acl) = squid_helper("ext_unix_group_acl") else {
        return;
    };
    bounded(Duration::from_secs(30), async {
        let dir = tempdir();
        let auth = Authenticator::start(&AuthConfig {
            htpasswd: Some(path_in(&dir, "passwords")),
            group_helper: Some(vec![group_acl, "-p".into()]),
            group_children: 2,
            ..AuthConfig::default()
        });
        // No password file: start fails before any helper runs.
        assert!(matches!(auth, Err(AuthError::Htpasswd { .. })));

        std::fs::write(path_in(&dir, "passwords"), "").expect("write");
        let Some(group_acl) = squid_helper("ext_unix_group_acl") else {
            return;
        };
        let auth = Authenticator::start(&AuthConfig {
            htpasswd: Some(path_in(&dir, "passwords")),
            group_helper: Some(vec![group_acl, "-p".into()]),
            group_children: 2,
            ..AuthConfig::default()
        })
        .expect("starts");
        // root's primary group is root (gid 0) on every Debian system (-p checks it).
        assert!(auth.in_group("root", "root").await.expect("answer"));
        assert!(!auth.in_group("root", "daemon").await.expect("answer"));
        assert!(!auth.in_group("no-such-user", "root").await.expect("answer"));
        assert!(!auth
            .in_group("root", "no such group")
            .await
            .expect("answer"));
        assert!(auth.in_group("root", "root").await.expect("answer"));
        let stats = auth.stats();
        assert_eq!(stats.group_checks, 5);
        assert_eq!(stats.group_cache_hits, 1);
        assert_eq!(stats.helper_requests, 4);
        assert!(matches!(
            auth.in_group("root", "").await,
            Err(AuthError::BadName)
        ));
        assert!(matches!(
            auth.in_group("ro\not", "root").await,
            Err(AuthError::BadName)
        ));
        while auth.group_helper_pids().len() < 2 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        auth.shutdown().await;
    })
    .await;
}
