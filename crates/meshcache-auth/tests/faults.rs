//! Helpers that misbehave, as small shell scripts speaking the real protocol over real pipes: one
//! that hangs, one that crashes on every request, ones killed while holding a request, one that
//! answers `BH`, one that exits at once, one that cannot be started; and helpers of the old bare `OK`/`ERR` kind and of the
//! concurrent kind answering out of order. Every check ends, in bounded time.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{bounded, path_in, sh, tempdir};
use meshcache_auth::{basic_value, AuthConfig, AuthError, Authenticator, HelperFailure, Verdict};
use tokio::task::JoinSet;

fn script_config(script: &str, children: usize, timeout: Duration) -> AuthConfig {
    AuthConfig {
        helper: Some(sh(script)),
        children,
        helper_timeout: timeout,
        ..AuthConfig::default()
    }
}

async fn check(auth: &Authenticator, user: &str, password: &str) -> Verdict {
    auth.check(basic_value(user, password).as_bytes()).await
}

/// Waits (up to 5 s) until `done` holds.
async fn eventually(mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !done() {
        assert!(Instant::now() < deadline, "condition not reached");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_hung_helper_times_out_is_restarted_and_the_check_ends_unavailable() {
    bounded(Duration::from_secs(30), async {
        let timeout = Duration::from_millis(300);
        let auth =
            Authenticator::start(&script_config("while read -r line; do :; done", 2, timeout))
                .expect("starts");
        let started = Instant::now();
        assert_eq!(check(&auth, "u", "p").await, Verdict::Unavailable);
        let took = started.elapsed();
        // Sent, timed out, sent to the other child, timed out again: about two timeouts.
        assert!(took >= timeout * 2, "{took:?}");
        assert!(took < timeout * 2 + Duration::from_secs(2), "{took:?}");
        let stats = auth.stats();
        assert_eq!(stats.timeouts, 2);
        assert_eq!(stats.failures, 1);
        assert_eq!(stats.helper_requests, 2);
        // Unavailable is not cached: the next check asks again.
        eventually(|| auth.stats().helper_restarts >= 2).await;
        assert_eq!(check(&auth, "u", "p").await, Verdict::Unavailable);
        assert_eq!(auth.stats().cache_hits, 0);
    })
    .await;
}

#[tokio::test]
async fn a_helper_crashing_on_every_request_is_unavailable_and_backs_off() {
    bounded(Duration::from_secs(30), async {
        let timeout = Duration::from_secs(1);
        let auth = Authenticator::start(&script_config("read -r line; exit 3", 2, timeout))
            .expect("starts");
        let started = Instant::now();
        assert_eq!(check(&auth, "u", "p").await, Verdict::Unavailable);
        assert!(started.elapsed() < Duration::from_secs(4));
        assert_eq!(auth.stats().helper_errors, 3, "three attempts, each died");

        // Keep asking for 3 s: the children are restarted with a growing delay, not in a loop.
        let begun = Instant::now();
        let until = begun + Duration::from_secs(3);
        let mut checks = 0;
        while Instant::now() < until {
            let one = Instant::now();
            assert_eq!(check(&auth, "u", "p").await, Verdict::Unavailable);
            // Bounded by the overall deadline: (3 attempts + 1) timeouts.
            assert!(one.elapsed() <= timeout * 4 + Duration::from_millis(500));
            checks += 1;
        }
        let stats = auth.stats();
        eprintln!("{checks} checks in 3 s against a crashing helper: {stats:?}");
        // A slot's n-th quick death comes (2^(n-1) - 1) × 100 ms after its first, so in the
        // time elapsed each of the two slots dies at most log2(elapsed / 100 ms + 1) + 1 times
        // (+1 for the check before). Without backoff it would be three per check, hundreds.
        let elapsed_ms = (begun.elapsed().as_millis() + 200) as f64;
        let per_slot = (elapsed_ms / 100.0 + 1.0).log2().floor() as u64 + 2;
        assert!(
            stats.helper_restarts <= 2 * per_slot,
            "{stats:?}, bound {per_slot} per slot"
        );
        assert!(stats.helper_restarts >= 4, "{stats:?}");
        assert_eq!(stats.accepted, 0);
    })
    .await;
}

#[tokio::test]
async fn a_request_held_by_a_killed_helper_is_sent_again() {
    bounded(Duration::from_secs(30), async {
        // Slow to answer, so the request is surely in flight when the children die.
        let auth = Arc::new(
            Authenticator::start(&script_config(
                "while read -r u p; do sleep 0.3; echo OK; done",
                2,
                Duration::from_secs(5),
            ))
            .expect("starts"),
        );
        let check = tokio::spawn({
            let auth = auth.clone();
            async move { check(&auth, "u", "p").await }
        });
        eventually(|| auth.stats().helper_requests == 1 && auth.helper_pids().len() == 2).await;
        for pid in auth.helper_pids() {
            common::kill9(pid);
        }
        assert_eq!(check.await.expect("task"), Verdict::User("u".into()));
        let stats = auth.stats();
        assert_eq!(stats.helper_errors, 1, "{stats:?}");
        assert_eq!(stats.helper_requests, 2, "{stats:?}");
        assert_eq!(stats.failures, 0);
        eventually(|| auth.stats().helper_restarts == 2).await;
    })
    .await;
}

#[tokio::test]
async fn bh_is_retried_on_another_child_then_unavailable() {
    bounded(Duration::from_secs(30), async {
        let auth = Authenticator::start(&script_config(
            r#"while read -r line; do echo 'BH message="backend down"'; done"#,
            3,
            Duration::from_secs(2),
        ))
        .expect("starts");
        assert_eq!(check(&auth, "u", "p").await, Verdict::Unavailable);
        let stats = auth.stats();
        assert_eq!(stats.helper_requests, 3);
        assert_eq!(stats.helper_errors, 3);
        assert_eq!(stats.helper_restarts, 0, "BH does not kill the helper");
    })
    .await;
}

#[tokio::test]
async fn a_helper_that_exits_at_once_or_cannot_start() {
    bounded(Duration::from_secs(30), async {
        let auth = Authenticator::start(&script_config("exit 0", 2, Duration::from_millis(500)))
            .expect("a program that starts, starts");
        let started = Instant::now();
        assert_eq!(check(&auth, "u", "p").await, Verdict::Unavailable);
        assert!(started.elapsed() < Duration::from_secs(3));

        let missing = AuthConfig {
            helper: Some(vec!["/nonexistent/basic_auth".into()]),
            ..AuthConfig::default()
        };
        assert!(matches!(
            Authenticator::start(&missing),
            Err(AuthError::Spawn { .. })
        ));
    })
    .await;
}

#[tokio::test]
async fn old_style_bare_replies_and_escaped_tokens() {
    bounded(Duration::from_secs(30), async {
        // Bare OK / ERR, no trailing space, no kv-pairs. The password arrives escaped.
        let auth = Authenticator::start(&script_config(
            r#"while read -r u p; do if [ "$p" = "good%20one%25" ]; then echo OK; else echo ERR; fi; done"#,
            1,
            Duration::from_secs(2),
        ))
        .expect("starts");
        assert_eq!(check(&auth, "al", "good one%").await, Verdict::User("al".into()));
        assert_eq!(
            check(&auth, "al", "good one").await,
            Verdict::Rejected { user: "al".into() }
        );
    })
    .await;
}

#[tokio::test]
async fn group_helper_failures_are_errors_not_cached() {
    bounded(Duration::from_secs(30), async {
        let dir = tempdir();
        std::fs::write(path_in(&dir, "passwords"), "").expect("write");
        let auth = Authenticator::start(&AuthConfig {
            htpasswd: Some(path_in(&dir, "passwords")),
            group_helper: Some(sh("while read -r line; do echo BH; done")),
            group_children: 1,
            ..AuthConfig::default()
        })
        .expect("starts");
        let error = auth.in_group("u", "g").await.expect_err("BH");
        assert!(matches!(
            error,
            AuthError::Unavailable {
                pool: "group",
                reason: HelperFailure::Broken
            }
        ));
        assert!(auth.in_group("u", "g").await.is_err());
        assert_eq!(auth.stats().group_cache_hits, 0);

        let without = Authenticator::start(&AuthConfig {
            htpasswd: Some(path_in(&dir, "passwords")),
            ..AuthConfig::default()
        })
        .expect("starts");
        assert!(matches!(
            without.in_group("u", "g").await,
            Err(AuthError::NoGroupHelper)
        ));
    })
    .await;
}

/// A concurrent helper (bash) that holds each request briefly for a second one and then
/// answers the second first, noting each swap in a file. `OK` when the password is
/// `pw-<user>`.
const OUT_OF_ORDER: &str = r#"
swaps="$1"
reply() { if [ "$3" = "pw-$2" ]; then echo "$1 OK"; else echo "$1 ERR message=\"wrong password\""; fi; }
while read -r c1 u1 p1; do
  if read -r -t 0.05 c2 u2 p2; then
    reply "$c2" "$u2" "$p2"; reply "$c1" "$u1" "$p1"; echo swap >> "$swaps"
  else
    reply "$c1" "$u1" "$p1"
  fi
done
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_channels_answered_out_of_order() {
    bounded(Duration::from_secs(60), async {
        let dir = tempdir();
        let swaps = path_in(&dir, "swaps");
        let auth = Arc::new(
            Authenticator::start(&AuthConfig {
                helper: Some(vec![
                    "/bin/bash".into(),
                    "-c".into(),
                    OUT_OF_ORDER.into(),
                    "out-of-order".into(),
                    swaps.to_string_lossy().into_owned(),
                ]),
                children: 2,
                concurrency: 8,
                helper_timeout: Duration::from_secs(5),
                ..AuthConfig::default()
            })
            .expect("starts"),
        );
        let mut tasks = JoinSet::new();
        for i in 0..400 {
            let auth = auth.clone();
            tasks.spawn(async move {
                let user = format!("u{i}");
                let password = if i % 3 == 0 {
                    "nope".to_owned()
                } else {
                    format!("pw-{user}")
                };
                let verdict = auth.check(basic_value(&user, &password).as_bytes()).await;
                (i, user, verdict)
            });
        }
        while let Some(done) = tasks.join_next().await {
            let (i, user, verdict) = done.expect("task");
            let expected = if i % 3 == 0 {
                Verdict::Rejected {
                    user: user.as_str().into(),
                }
            } else {
                Verdict::User(user.as_str().into())
            };
            assert_eq!(verdict, expected, "request {i}");
        }
        let swapped = std::fs::read_to_string(&swaps)
            .unwrap_or_default()
            .lines()
            .count();
        let stats = auth.stats();
        eprintln!("{swapped} pairs answered out of order; {stats:?}");
        assert!(swapped > 0, "the helper never answered out of order");
        assert_eq!(stats.failures, 0);
        assert_eq!(stats.helper_requests, 400);
    })
    .await;
}
