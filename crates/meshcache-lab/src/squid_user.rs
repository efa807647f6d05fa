//! Who a Squid node runs as, and what that user may do with a folder.
//!
//! Squid started by root does not stay root: it reads its squid.conf, then drops to its
//! `cache_effective_user` (Debian builds it with `proxy` as the default) *before* it opens its
//! access log, cache log and PID file. Those live in the node's folder under the results
//! folder, so that user must be able to write the node's folder and to enter every folder above
//! it. A results folder made with `mktemp -d` (mode 0700, owner root) is one it cannot enter:
//! every Squid node then dies at start with "Cannot open … access.log for writing". The lab
//! therefore names the user explicitly in every squid.conf it writes (so it knows which one it
//! is), hands the node folders to it, and checks the folders above before a run
//! ([`crate::preflight`]). Started by any other user, Squid keeps that user, who made the
//! folders itself.
//!
//! Permissions are judged from the mode bits, owner and group of each folder, as the kernel
//! judges them for that user (owner bits if it owns the folder, else group bits if it is in the
//! group, else the others' bits); POSIX ACLs are not read.

use std::fs::Metadata;
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;
use std::process::{Command, Stdio};

/// A user account: the ids the kernel checks permissions against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Account {
    /// Its name.
    pub name: String,
    /// Its user id.
    pub uid: u32,
    /// Its primary group id.
    pub gid: u32,
    /// Its supplementary group ids.
    pub groups: Vec<u32>,
}

/// Read, write and search (execute) permission, as in a mode's `rwx` triplets.
pub const READ: u32 = 4;
/// Write permission.
pub const WRITE: u32 = 2;
/// Search (enter, for a folder) permission.
pub const SEARCH: u32 = 1;

impl Account {
    /// The `rwx` bits (as [`READ`] | [`WRITE`] | [`SEARCH`]) that `meta`'s mode grants this
    /// user. Root may do anything with a folder.
    pub fn granted(&self, meta: &Metadata) -> u32 {
        self.granted_by(meta.mode(), meta.uid(), meta.gid())
    }

    /// [`Account::granted`] from the raw mode, owner and group.
    pub fn granted_by(&self, mode: u32, owner: u32, group: u32) -> u32 {
        if self.uid == 0 {
            return READ | WRITE | SEARCH;
        }
        (mode >> (3 * self.class(owner, group).shift())) & 7
    }

    /// Which of the mode's triplets applies to this user for a file of `owner` and `group`.
    pub fn class(&self, owner: u32, group: u32) -> Class {
        if owner == self.uid {
            Class::Owner
        } else if group == self.gid || self.groups.contains(&group) {
            Class::Group
        } else {
            Class::Others
        }
    }
}

/// One of a mode's three `rwx` triplets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// The owner's.
    Owner,
    /// The group's.
    Group,
    /// Everyone else's.
    Others,
}

impl Class {
    /// Its letter in `chmod`'s symbolic modes.
    pub fn letter(self) -> char {
        match self {
            Class::Owner => 'u',
            Class::Group => 'g',
            Class::Others => 'o',
        }
    }

    fn shift(self) -> u32 {
        match self {
            Class::Owner => 2,
            Class::Group => 1,
            Class::Others => 0,
        }
    }
}

/// Who the lab's Squid nodes run as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunsAs {
    /// The lab is not root: Squid keeps the lab's own user, who makes the node folders.
    Lab(Account),
    /// The lab is root: Squid drops to this user, who must be able to reach the node folders.
    Drops(Account),
    /// The lab is root, but the user Squid would drop to does not exist here.
    Missing(String),
}

impl RunsAs {
    /// The account Squid runs as, if it exists.
    pub fn account(&self) -> Option<&Account> {
        match self {
            RunsAs::Lab(a) | RunsAs::Drops(a) => Some(a),
            RunsAs::Missing(_) => None,
        }
    }

    /// The user Squid drops to, when the lab is root.
    pub fn dropped_to(&self) -> Option<&Account> {
        match self {
            RunsAs::Drops(a) => Some(a),
            _ => None,
        }
    }
}

/// The user the lab's squid.conf names when the lab is root, where it exists: Debian's.
pub const PREFERRED_USER: &str = "proxy";

/// Who the Squid at `squid` runs as when this process starts it: the lab's own user unless
/// the lab is root; as root, [`PREFERRED_USER`] if it exists, else the user the binary was
/// built to drop to (`squid -v`'s `--with-default-user`, Squid's own default `nobody` when it
/// does not say).
pub fn runs_as(squid: &Path) -> RunsAs {
    if !rustix::process::geteuid().is_root() {
        return RunsAs::Lab(this_process());
    }
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let group = std::fs::read_to_string("/etc/group").unwrap_or_default();
    let name = if lookup(&passwd, &group, PREFERRED_USER).is_some() {
        PREFERRED_USER.to_string()
    } else {
        let version = Command::new(squid)
            .arg("-v")
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        built_in_user(&version)
    };
    match lookup(&passwd, &group, &name) {
        Some(account) => RunsAs::Drops(account),
        None => RunsAs::Missing(name),
    }
}

/// The user a Squid build drops to by default, from its `squid -v` text.
pub fn built_in_user(version: &str) -> String {
    version
        .split_whitespace()
        .find_map(|arg| {
            arg.trim_matches('\'')
                .strip_prefix("--with-default-user=")
                .map(str::to_string)
        })
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "nobody".into())
}

/// The account `name` of a passwd file's text, with its groups from a group file's text.
pub fn lookup(passwd: &str, group: &str, name: &str) -> Option<Account> {
    let entry = passwd
        .lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.first() == Some(&name))?;
    let uid = entry.get(2)?.parse().ok()?;
    let gid = entry.get(3)?.parse().ok()?;
    let groups = group
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            let members = f.get(3)?;
            members
                .split(',')
                .any(|m| m.trim() == name)
                .then(|| f.get(2)?.parse().ok())
                .flatten()
        })
        .collect();
    Some(Account {
        name: name.to_string(),
        uid,
        gid,
        groups,
    })
}

/// The name of user `uid` in a passwd file's text.
pub fn user_name(passwd: &str, uid: u32) -> Option<String> {
    passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.get(2)?.parse::<u32>().ok()? == uid).then(|| f[0].to_string())
    })
}

/// This process's effective user, primary group and supplementary groups.
fn this_process() -> Account {
    let uid = rustix::process::geteuid().as_raw();
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    Account {
        name: user_name(&passwd, uid).unwrap_or_else(|| uid.to_string()),
        uid,
        gid: rustix::process::getegid().as_raw(),
        groups: rustix::process::getgroups()
            .map(|g| g.into_iter().map(|g| g.as_raw()).collect())
            .unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\n\
                          proxy:x:13:13:proxy:/bin:/usr/sbin/nologin\n\
                          bad:x:notanumber:1::/:/bin/sh\n";
    const GROUP: &str = "root:x:0:\nproxy:x:13:\nshadow:x:42:proxy,other\nlab:x:1000:other\n";

    #[test]
    fn accounts_are_read_from_passwd_and_group() {
        let proxy = lookup(PASSWD, GROUP, "proxy").expect("proxy");
        assert_eq!((proxy.uid, proxy.gid, proxy.groups), (13, 13, vec![42]));
        assert!(lookup(PASSWD, GROUP, "squid").is_none());
        assert!(lookup(PASSWD, GROUP, "bad").is_none());
        assert_eq!(user_name(PASSWD, 13).as_deref(), Some("proxy"));
        assert_eq!(user_name(PASSWD, 7), None);
    }

    #[test]
    fn the_built_in_user_comes_from_squid_v() {
        let v = "Squid Cache: Version 5.7\nconfigure options:  '--prefix=/usr' \
                 '--with-default-user=proxy' '--enable-ssl'\n";
        assert_eq!(built_in_user(v), "proxy");
        assert_eq!(built_in_user("Squid Cache: Version 6.1\n"), "nobody");
    }

    #[test]
    fn the_kernel_s_triplet_decides() {
        let u = Account {
            name: "proxy".into(),
            uid: 13,
            gid: 13,
            groups: vec![42],
        };
        // Others: a mktemp -d folder of root's is closed; o+x opens it.
        assert_eq!(u.granted_by(0o700, 0, 0), 0);
        assert_eq!(u.granted_by(0o701, 0, 0), SEARCH);
        // Group, primary or supplementary.
        assert_eq!(u.granted_by(0o750, 0, 42), READ | SEARCH);
        assert_eq!(u.class(0, 13), Class::Group);
        // The owner's bits apply to the owner even when others may do more.
        assert_eq!(u.granted_by(0o077, 13, 0), 0);
        assert_eq!(u.class(13, 0).letter(), 'u');
        // Root may enter anything.
        let root = Account {
            name: "root".into(),
            uid: 0,
            gid: 0,
            groups: vec![],
        };
        assert_eq!(root.granted_by(0o000, 5, 5), READ | WRITE | SEARCH);
    }
}
