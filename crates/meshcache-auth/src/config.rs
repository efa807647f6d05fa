//! `[auth]`: how proxy users are authenticated.
//!
//! One backend, either an htpasswd file or a Squid basic auth helper, and optionally a Squid
//! external ACL helper for group membership. In TOML:
//!
//! ```toml
//! realm = "meshcache proxy"
//! helper = ["/usr/lib/squid/basic_ncsa_auth", "/etc/squid/passwords"]
//! children = 5
//! credentials_ttl = "1h"
//! group_helper = ["/usr/lib/squid/ext_unix_group_acl", "-p"]
//! ```
//!
//! Defaults, and why:
//!
//! * `children` 5, `concurrency` 0: Squid's `auth_param basic children 5` and its default
//!   one-request-at-a-time protocol, which every helper Debian ships speaks.
//! * `credentials_ttl` 1 hour: how long a checked user and password are taken as valid without
//!   asking again. Squid's `credentialsttl` is 2 hours; an hour halves how long a password
//!   changed or an account locked in the backend keeps working, and a cached check is cheap
//!   (well under a microsecond) while a miss costs one helper round trip. With an htpasswd file
//!   the TTL matters less: a changed file drops every cached verdict at once.
//! * `negative_ttl` 30 s: how long a wrong password is remembered, so a client retrying the same
//!   wrong credentials in a loop does not reach the helper each time. The key includes the
//!   password, so typing the right one is never held up by it.
//! * `helper_timeout` 5 s: a helper silent that long is taken as hung: it is killed and
//!   restarted, and the request retried once on another; a second timeout ends the request as
//!   unavailable. So a check never waits longer than about twice this.
//! * `group_ttl` 1 hour, for membership and non-membership alike: Squid's `external_acl_type`
//!   `ttl` (its `negative_ttl` defaults to the same).
//! * `max_cached` 65,536 credentials (and as many group answers): about 100 bytes each.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::AuthError;

/// Proxy authentication settings. The default has no backend and does not validate: the proxy
/// turns authentication on only when the section names one.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// The realm in the `Proxy-Authenticate` challenge: what browsers show in the login box.
    pub realm: String,
    /// An htpasswd file (bcrypt, `{SHA}`, `$apr1$`); reloaded when it changes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub htpasswd: Option<PathBuf>,
    /// A Squid basic auth helper's command line, e.g.
    /// `["/usr/lib/squid/basic_ncsa_auth", "/etc/squid/passwords"]`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub helper: Option<Vec<String>>,
    /// How many helper processes run.
    pub children: usize,
    /// Requests each helper takes at once, with channel-IDs; 0 is Squid's one-at-a-time
    /// protocol without IDs. Only for helpers that support it (or behind Squid's `helper-mux`).
    pub concurrency: usize,
    /// How long valid credentials are remembered.
    #[serde(with = "humantime_serde")]
    pub credentials_ttl: Duration,
    /// How long rejected credentials are remembered.
    #[serde(with = "humantime_serde")]
    pub negative_ttl: Duration,
    /// How long a helper may take to answer one request before it is taken as hung.
    #[serde(with = "humantime_serde")]
    pub helper_timeout: Duration,
    /// A Squid external ACL helper's command line for group membership (`user group` in,
    /// `OK`/`ERR` out), e.g. `["/usr/lib/squid/ext_unix_group_acl", "-p"]`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group_helper: Option<Vec<String>>,
    /// How many group helper processes run.
    pub group_children: usize,
    /// Requests each group helper takes at once (0: one at a time, without channel-IDs).
    pub group_concurrency: usize,
    /// How long a group answer (member or not) is remembered.
    #[serde(with = "humantime_serde")]
    pub group_ttl: Duration,
    /// The most credentials remembered (and, separately, the most group answers).
    pub max_cached: usize,
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            realm: "meshcache proxy".into(),
            htpasswd: None,
            helper: None,
            children: 5,
            concurrency: 0,
            credentials_ttl: Duration::from_secs(3600),
            negative_ttl: Duration::from_secs(30),
            helper_timeout: Duration::from_secs(5),
            group_helper: None,
            group_children: 5,
            group_concurrency: 0,
            group_ttl: Duration::from_secs(3600),
            max_cached: 65_536,
        }
    }
}

/// The most helper processes of one kind.
pub const MAX_CHILDREN: usize = 1000;
/// The most concurrent requests per helper.
pub const MAX_CONCURRENCY: usize = 1000;

impl AuthConfig {
    /// Checks the settings, naming the first key that is wrong.
    pub fn validate(&self) -> Result<(), AuthError> {
        if self.realm.is_empty()
            || self.realm.len() > 200
            || self
                .realm
                .chars()
                .any(|c| c.is_control() || c == '"' || c == '\\')
        {
            return Err(AuthError::Invalid {
                field: "realm",
                reason:
                    "must be 1 to 200 characters without quotes, backslashes or control characters",
            });
        }
        match (&self.htpasswd, &self.helper) {
            (None, None) => return Err(AuthError::NoBackend),
            (Some(_), Some(_)) => return Err(AuthError::BothBackends),
            (Some(path), None) if path.as_os_str().is_empty() => {
                return Err(AuthError::Invalid {
                    field: "htpasswd",
                    reason: "is an empty path",
                })
            }
            (None, Some(argv)) => {
                check_command("helper", argv)?;
                check_pool("children", self.children, "concurrency", self.concurrency)?;
            }
            (Some(_), None) => {}
        }
        if let Some(argv) = &self.group_helper {
            check_command("group_helper", argv)?;
            check_pool(
                "group_children",
                self.group_children,
                "group_concurrency",
                self.group_concurrency,
            )?;
        }
        if self.helper_timeout.is_zero() {
            return Err(AuthError::Invalid {
                field: "helper_timeout",
                reason: "must be above zero",
            });
        }
        Ok(())
    }
}

fn check_command(field: &'static str, argv: &[String]) -> Result<(), AuthError> {
    match argv.first() {
        Some(program) if !program.is_empty() => Ok(()),
        _ => Err(AuthError::EmptyCommand { field }),
    }
}

fn check_pool(
    children_field: &'static str,
    children: usize,
    concurrency_field: &'static str,
    concurrency: usize,
) -> Result<(), AuthError> {
    if children == 0 || children > MAX_CHILDREN {
        return Err(AuthError::Invalid {
            field: children_field,
            reason: "must be 1 to 1000",
        });
    }
    if concurrency > MAX_CONCURRENCY {
        return Err(AuthError::Invalid {
            field: concurrency_field,
            reason: "must be 0 to 1000",
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_helper() -> AuthConfig {
        AuthConfig {
            helper: Some(vec!["/bin/true".into()]),
            ..AuthConfig::default()
        }
    }

    #[test]
    fn validation_names_the_fault() {
        assert!(matches!(
            AuthConfig::default().validate(),
            Err(AuthError::NoBackend)
        ));
        assert!(with_helper().validate().is_ok());
        let both = AuthConfig {
            htpasswd: Some("/etc/squid/passwords".into()),
            ..with_helper()
        };
        assert!(matches!(both.validate(), Err(AuthError::BothBackends)));
        let empty = AuthConfig {
            helper: Some(vec![]),
            ..AuthConfig::default()
        };
        assert!(matches!(
            empty.validate(),
            Err(AuthError::EmptyCommand { field: "helper" })
        ));
        let empty_program = AuthConfig {
            group_helper: Some(vec![String::new(), "-p".into()]),
            ..with_helper()
        };
        assert!(matches!(
            empty_program.validate(),
            Err(AuthError::EmptyCommand {
                field: "group_helper"
            })
        ));
        let no_children = AuthConfig {
            children: 0,
            ..with_helper()
        };
        assert!(matches!(
            no_children.validate(),
            Err(AuthError::Invalid {
                field: "children",
                ..
            })
        ));
        let quote = AuthConfig {
            realm: "a\"b".into(),
            ..with_helper()
        };
        assert!(matches!(
            quote.validate(),
            Err(AuthError::Invalid { field: "realm", .. })
        ));
        let zero = AuthConfig {
            helper_timeout: Duration::ZERO,
            ..with_helper()
        };
        assert!(matches!(
            zero.validate(),
            Err(AuthError::Invalid {
                field: "helper_timeout",
                ..
            })
        ));
        // An htpasswd backend ignores the helper pool's sizes.
        let file = AuthConfig {
            htpasswd: Some("/etc/squid/passwords".into()),
            children: 0,
            ..AuthConfig::default()
        };
        assert!(file.validate().is_ok());
    }

    #[test]
    fn toml_in_human_units_and_strict() {
        let config: AuthConfig = toml::from_str(
            r#"
            realm = "office"
            helper = ["/usr/lib/squid/basic_ncsa_auth", "/etc/squid/passwords"]
            concurrency = 4
            credentials_ttl = "10m"
            negative_ttl = "5s"
            group_helper = ["/usr/lib/squid/ext_unix_group_acl", "-p"]
            "#,
        )
        .expect("parses");
        assert_eq!(config.realm, "office");
        assert_eq!(config.children, 5);
        assert_eq!(config.concurrency, 4);
        assert_eq!(config.credentials_ttl, Duration::from_secs(600));
        assert_eq!(config.negative_ttl, Duration::from_secs(5));
        assert!(config.validate().is_ok());
        let round = toml::to_string(&config).expect("serializes");
        assert_eq!(
            toml::from_str::<AuthConfig>(&round).expect("parses back"),
            config
        );
        let unknown = toml::from_str::<AuthConfig>("childs = 3").expect_err("unknown key");
        assert!(unknown.to_string().contains("childs"), "{unknown}");
        assert_eq!(
            toml::from_str::<AuthConfig>("").expect("empty"),
            AuthConfig::default()
        );
    }
}
