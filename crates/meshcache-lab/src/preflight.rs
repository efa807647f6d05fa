//! Before a run: everything the lab's start-up needs from this machine, checked before the
//! first configuration runs.
//!
//! An experiment's configurations run one after the other, each starting its own origins,
//! relays and nodes. What the machine lacks used to show only when the first node of its kind
//! started — a Squid that cannot write its logs, a port taken, a program missing — and a Squid
//! configuration often comes after meshcache configurations that took minutes. [`check`] finds
//! these up front and says, one line each, what is wrong and what to do; the run is then
//! refused with [`Refused`] before anything starts. What it checks:
//!
//! * the programs every node is started through (`setpriv`, and `taskset` when the nodes are
//!   pinned), the meshcache binary (meshcache nodes) and a squid binary (Squid nodes);
//! * who Squid runs as (`crate::squid_user`): as root it drops to its own user, who must
//!   exist, must be able to enter every folder above the nodes' folders (judged from each
//!   folder's mode bits for that user), and must be able to create shared memory in
//!   `/dev/shm`. The lab hands each Squid node's folder to that user and creates its own
//!   folders enterable ([`crate::folders`]); a folder it did not create is never changed, and
//!   one that keeps Squid's user out refuses the run with the `chmod` that would let it in;
//! * that the nodes' CPU list (`nodes.cpus`) is one `taskset` accepts here;
//! * that every listening address of the nodes (HTTP, ICP, admin) and of the origins is free:
//!   a real socket is bound to each and let go.
//!
//! Whether the lab may make a network namespace of its own is checked where the namespace is
//! made, by the command, with [`netns_problem`].

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::fs;
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::node::which;
use crate::squid_user::{self, Account, RunsAs, SEARCH, WRITE};

/// One thing that keeps a run from starting: what is wrong, and what to do about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// What is wrong.
    pub what: String,
    /// What to do.
    pub todo: String,
}

impl Problem {
    /// A problem and its remedy.
    pub fn new(what: impl Into<String>, todo: impl Into<String>) -> Problem {
        Problem {
            what: what.into(),
            todo: todo.into(),
        }
    }
}

impl fmt::Display for Problem {
    /// One line: what is wrong, then what to do.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.what, self.todo)
    }
}

/// A run refused before it started, with every problem found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused(pub Vec<Problem>);

impl fmt::Display for Refused {
    /// One line per problem.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Refused {}

/// A program the lab runs, found on `PATH`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Program {
    /// Its name.
    pub name: String,
    /// What the lab runs it for.
    pub why: String,
    /// The Debian package that has it.
    pub package: String,
}

impl Program {
    /// A program, what it is for, and its Debian package.
    pub fn new(name: &str, why: &str, package: &str) -> Program {
        Program {
            name: name.into(),
            why: why.into(),
            package: package.into(),
        }
    }
}

/// What the runs of an experiment need from the machine.
#[derive(Clone, Debug, Default)]
pub struct Needs {
    /// Some run has Squid nodes.
    pub squid: bool,
    /// The squid binary found, if any.
    pub squid_binary: Option<PathBuf>,
    /// Who Squid runs as (`squid_user::runs_as`), known once the binary is found.
    pub squid_user: Option<RunsAs>,
    /// The meshcache binary, when some run has meshcache nodes.
    pub meshcache: Option<PathBuf>,
    /// Programs the nodes are started through.
    pub programs: Vec<Program>,
    /// The nodes' `taskset -c` CPU list; empty: not pinned.
    pub node_cpus: String,
    /// TCP addresses the runs listen on, each with what listens there.
    pub tcp: BTreeMap<SocketAddr, String>,
    /// UDP addresses the runs listen on, each with what listens there.
    pub udp: BTreeMap<SocketAddr, String>,
    /// The (existing) results folder: the nodes' folders are made below it, in folders the lab
    /// creates ([`crate::folders`]).
    pub results_folder: PathBuf,
}

/// Every problem that would stop the runs `needs` describes; empty when they can start.
pub fn check(needs: &Needs) -> Vec<Problem> {
    let mut problems = Vec::new();
    for p in &needs.programs {
        if which(&p.name).is_none() {
            problems.push(Problem::new(
                format!("{} is not installed ({})", p.name, p.why),
                format!("install it (Debian: apt-get install {})", p.package),
            ));
        }
    }
    if let Some(m) = &needs.meshcache {
        if !m.is_file() {
            problems.push(Problem::new(
                format!("the meshcache binary {} does not exist", m.display()),
                "build it (cargo build --release) and run the lab from it",
            ));
        }
    }
    if needs.squid {
        problems.extend(squid_problems(needs));
    }
    if !needs.node_cpus.is_empty() && which("taskset").is_some() {
        problems.extend(cpus_problem(&needs.node_cpus));
    }
    problems.extend(address_problems(needs));
    problems
}

/// The Squid binary, its user, the folders and shared memory that user needs.
fn squid_problems(needs: &Needs) -> Vec<Problem> {
    let mut problems = Vec::new();
    if needs.squid_binary.is_none() {
        problems.push(Problem::new(
            "the experiment runs Squid nodes, but no squid binary was found (in /usr/sbin, \
             /usr/local/sbin, /usr/bin or on PATH)",
            "install it (Debian: apt-get install squid), or leave Squid out (--product meshcache)",
        ));
        return problems;
    }
    match &needs.squid_user {
        Some(RunsAs::Missing(name)) => problems.push(Problem::new(
            format!("Squid, started by root, drops to user {name}, which does not exist here"),
            format!(
                "create it (adduser --system --no-create-home {name}), or run the lab as \
                 another user"
            ),
        )),
        Some(runs_as) => {
            if let Some(user) = runs_as.account() {
                problems.extend(folder_problems(&needs.results_folder, user));
                problems.extend(shm_problem(Path::new("/dev/shm"), user));
            }
        }
        None => {}
    }
    problems
}

/// Every folder above and including `folder` that `user` may not enter, outermost first: the
/// folder as given (absolute) and as resolved (symbolic links followed), both of which the
/// kernel walks.
pub fn folder_problems(folder: &Path, user: &Account) -> Vec<Problem> {
    let passwd = fs::read_to_string("/etc/passwd").unwrap_or_default();
    let mut seen = BTreeSet::new();
    let mut problems = Vec::new();
    let walks = [
        std::path::absolute(folder).ok(),
        fs::canonicalize(folder).ok(),
    ];
    for walk in walks.into_iter().flatten() {
        let mut chain: Vec<&Path> = walk.ancestors().collect();
        chain.reverse();
        for dir in chain {
            if !seen.insert(dir.to_path_buf()) {
                continue;
            }
            let Ok(meta) = fs::metadata(dir) else {
                continue;
            };
            if user.granted(&meta) & SEARCH != 0 {
                continue;
            }
            let owner = squid_user::user_name(&passwd, meta.uid())
                .unwrap_or_else(|| meta.uid().to_string());
            let class = user.class(meta.uid(), meta.gid()).letter();
            let shown = shell_word(dir);
            problems.push(Problem::new(
                format!(
                    "Squid runs as user {u}, who may not enter {shown} (mode {mode:04o}, owner \
                     {owner}), so its nodes could not open their logs below it",
                    u = user.name,
                    mode = meta.mode() & 0o7777,
                ),
                format!(
                    "chmod {class}+x {shown} (lets it pass through, not list), or give --out a \
                     folder {u} can reach",
                    u = user.name
                ),
            ));
        }
    }
    problems
}

/// Squid keeps shared-memory segments in `shm` (`/dev/shm`), as the user it runs as.
fn shm_problem(shm: &Path, user: &Account) -> Option<Problem> {
    let Ok(meta) = fs::metadata(shm) else {
        return Some(Problem::new(
            format!(
                "{} does not exist, and Squid keeps its shared memory there",
                shm.display()
            ),
            format!(
                "mount a tmpfs there (mount -t tmpfs tmpfs {})",
                shm.display()
            ),
        ));
    };
    (user.granted(&meta) & (WRITE | SEARCH) != WRITE | SEARCH).then(|| {
        Problem::new(
            format!(
                "Squid runs as user {}, who may not create its shared memory in {} (mode {:04o})",
                user.name,
                shm.display(),
                meta.mode() & 0o7777
            ),
            format!("chmod 1777 {} (its usual mode)", shm.display()),
        )
    })
}

/// Whether `taskset` accepts the nodes' CPU list here: it is run once on it, as a node's start
/// would run it.
fn cpus_problem(cpus: &str) -> Option<Problem> {
    let out = Command::new("taskset")
        .args(["-c", cpus, "true"])
        .stdin(Stdio::null())
        .output();
    let why = match out {
        Ok(o) if o.status.success() => return None,
        Ok(o) => first_line(&String::from_utf8_lossy(&o.stderr)),
        Err(e) => e.to_string(),
    };
    let online = fs::read_to_string("/sys/devices/system/cpu/online")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into());
    Some(Problem::new(
        format!("nodes.cpus = {cpus:?} cannot pin the nodes here ({why})"),
        format!("name CPUs this machine lets the lab use (online: {online}), or none"),
    ))
}

/// Binds every address the runs listen on, and lets it go.
fn address_problems(needs: &Needs) -> Vec<Problem> {
    let tcp = needs
        .tcp
        .iter()
        .map(|(a, what)| (a, what, "TCP", std::net::TcpListener::bind(a).map(drop)));
    let udp = needs
        .udp
        .iter()
        .map(|(a, what)| (a, what, "UDP", std::net::UdpSocket::bind(a).map(drop)));
    tcp.chain(udp)
        .filter_map(|(addr, what, proto, bound)| {
            let e = bound.err()?;
            Some(if e.kind() == std::io::ErrorKind::AddrInUse {
                Problem::new(
                    format!("{proto} {addr} ({what}) is already in use"),
                    "stop what listens there, or run the lab in a network namespace of its \
                     own (--netns on, as root)",
                )
            } else {
                Problem::new(
                    format!("cannot listen on {proto} {addr} ({what}): {e}"),
                    "the lab needs every address of 127.0.0.0/8 on loopback (a network \
                     namespace of its own has them: --netns on, as root)",
                )
            })
        })
        .collect()
}

/// Why this process cannot make a network namespace of its own with loopback up (as the
/// command makes it: `unshare --net`, then `ip link set lo up` inside), or `None` if it can.
/// One namespace is made and discarded to find out.
pub fn netns_problem() -> Option<Problem> {
    let what = "no network namespace of its own";
    let counts = "or run with --netns off (UDP/TCP counts then include other traffic)";
    for (program, package) in [("unshare", "util-linux"), ("ip", "iproute2")] {
        if which(program).is_none() {
            return Some(Problem::new(
                format!("{what}: {program} is not installed"),
                format!("install it (Debian: apt-get install {package}), {counts}"),
            ));
        }
    }
    let out = Command::new("unshare")
        .args(["--net", "--", "ip", "link", "set", "lo", "up"])
        .stdin(Stdio::null())
        .output();
    let why = match out {
        Ok(o) if o.status.success() => return None,
        Ok(o) => first_line(&String::from_utf8_lossy(&o.stderr)),
        Err(e) => e.to_string(),
    };
    Some(Problem::new(
        format!("{what}: unshare --net is not permitted here ({why})"),
        format!("run as root (it needs CAP_SYS_ADMIN), {counts}"),
    ))
}

fn first_line(text: &str) -> String {
    let line = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    if line.is_empty() {
        "no reason given".into()
    } else {
        line.trim().to_string()
    }
}

/// A path as one shell word (single-quoted when it holds anything but the usual characters).
fn shell_word(path: &Path) -> String {
    let s = path.to_string_lossy();
    if s.chars()
        .all(|c| c.is_ascii_alphanumeric() || "/._-+,:@".contains(c))
    {
        s.into_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    /// A user that owns nothing here and is in none of its groups.
    fn stranger() -> Account {
        Account {
            name: "stranger".into(),
            uid: 54_321,
            gid: 54_321,
            groups: vec![],
        }
    }

    fn chmod(path: &Path, mode: u32) {
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).expect("chmod");
    }

    #[test]
    fn a_taken_port_is_named() {
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        let (t, u) = (
            tcp.local_addr().expect("addr"),
            udp.local_addr().expect("addr"),
        );
        let needs = Needs {
            tcp: [(t, "origin www.g0.br".to_string())].into(),
            udp: [(u, "ICP port of node n0".to_string())].into(),
            ..Needs::default()
        };
        let problems = check(&needs);
        assert_eq!(problems.len(), 2, "{problems:?}");
        let text = Refused(problems).to_string();
        assert!(
            text.contains(&format!("TCP {t} (origin www.g0.br) is already in use")),
            "{text}"
        );
        assert!(
            text.contains(&format!("UDP {u} (ICP port of node n0) is already in use")),
            "{text}"
        );
        assert_eq!(text.lines().count(), 2, "one line each: {text}");
        // Let go, the same addresses are fine.
        drop((tcp, udp));
        assert_eq!(check(&needs), vec![]);
    }

    #[test]
    fn missing_programs_and_squid_are_named_with_their_package() {
        let needs = Needs {
            squid: true,
            squid_binary: None,
            meshcache: Some(PathBuf::from("/nonexistent/meshcache")),
            programs: vec![Program::new(
                "meshcache-no-such-program",
                "every node is started through it",
                "some-package",
            )],
            ..Needs::default()
        };
        let problems: Vec<String> = check(&needs).iter().map(ToString::to_string).collect();
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems[0].starts_with(
            "meshcache-no-such-program is not installed (every node is started through it): \
             install it (Debian: apt-get install some-package)"
        ));
        assert!(problems[1].contains("/nonexistent/meshcache does not exist"));
        assert!(problems[2].contains("no squid binary was found"));
        assert!(problems[2].contains("apt-get install squid"));
    }

    #[test]
    fn a_squid_user_that_does_not_exist_is_named() {
        let needs = Needs {
            squid: true,
            squid_binary: Some(PathBuf::from("/usr/sbin/squid")),
            squid_user: Some(RunsAs::Missing("proxy".into())),
            ..Needs::default()
        };
        let problems = check(&needs);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0]
            .what
            .contains("drops to user proxy, which does not exist"));
    }

    /// A mktemp -d folder (0700) keeps out a user that is not its owner, judged from its mode
    /// bits; the fix names the folder and the triplet that applies.
    #[test]
    fn a_folder_squid_s_user_cannot_enter_is_named_with_its_fix() {
        let base = tempfile::Builder::new()
            .prefix("preflight")
            .tempdir()
            .expect("tempdir");
        chmod(base.path(), 0o755);
        let closed = base.path().join("closed");
        let runs = closed.join("out/runs");
        fs::create_dir_all(&runs).expect("mkdir");
        chmod(&closed, 0o700);
        let user = stranger();
        // Whatever keeps the stranger out above the temporary folder is not this test's.
        let above = folder_problems(base.path(), &user);
        let problems = folder_problems(&runs, &user);
        assert_eq!(problems.len(), above.len() + 1, "{problems:?}");
        let line = problems[above.len()].to_string();
        assert!(
            line.contains(&format!(
                "user stranger, who may not enter {} (mode 0700",
                closed.display()
            )),
            "{line}"
        );
        assert!(
            line.contains(&format!("chmod o+x {}", closed.display())),
            "{line}"
        );
        assert_eq!(line.lines().count(), 1);
        // What the fix says is enough.
        chmod(&closed, 0o701);
        assert_eq!(folder_problems(&runs, &user), above);
        // Through the check, with Squid dropping to that user.
        chmod(&closed, 0o700);
        let needs = Needs {
            squid: true,
            squid_binary: Some(PathBuf::from("/usr/sbin/squid")),
            squid_user: Some(RunsAs::Drops(user)),
            results_folder: runs.clone(),
            ..Needs::default()
        };
        assert!(check(&needs).contains(&problems[above.len()]));
    }

    #[test]
    fn shared_memory_must_be_writable_by_squid_s_user() {
        let dir = tempfile::tempdir().expect("tempdir");
        chmod(dir.path(), 0o755);
        let p = shm_problem(dir.path(), &stranger()).expect("not writable");
        assert!(p.todo.starts_with("chmod 1777"), "{p}");
        chmod(dir.path(), 0o1777);
        assert_eq!(shm_problem(dir.path(), &stranger()), None);
        assert!(shm_problem(&dir.path().join("none"), &stranger())
            .expect("missing")
            .what
            .contains("does not exist"));
    }

    #[test]
    fn a_cpu_list_taskset_refuses_is_named() {
        // Parsed as a list, but no machine this runs on has CPU 1000.
        let needs = Needs {
            node_cpus: "1000".into(),
            programs: vec![Program::new(
                "taskset",
                "the nodes are pinned",
                "util-linux",
            )],
            ..Needs::default()
        };
        let problems = check(&needs);
        assert_eq!(problems.len(), 1, "{problems:?}");
        let line = problems[0].to_string();
        assert!(
            line.contains("nodes.cpus = \"1000\"") || line.contains("taskset is not installed"),
            "{line}"
        );
    }

    #[test]
    fn paths_become_one_shell_word() {
        assert_eq!(shell_word(Path::new("/tmp/tmp.AbC9")), "/tmp/tmp.AbC9");
        assert_eq!(shell_word(Path::new("/tmp/a b")), "'/tmp/a b'");
        assert_eq!(shell_word(Path::new("/tmp/it's")), r"'/tmp/it'\''s'");
    }
}
