//! The folders the lab makes on the way to its nodes' folders.
//!
//! A Squid node started by root runs as another user (`crate::squid_user`) that must enter
//! every folder above its own. Under a strict umask (077) the folders the lab creates would be
//! closed to that user like any other, so each folder the lab creates itself gets search
//! permission for its group and for others: `--x`, which lets a user pass through it to a
//! folder it owns, not list it or read what is in it. Folders that already exist, the one given
//! as `--out` among them, are never changed: whether they let Squid's user through is checked
//! before a run and, if they do not, the run is refused with the command that would fix them
//! (see docs/lab.md, "Before a run").

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

/// The bits added to every folder the lab creates: search for group and others.
pub const PASS_THROUGH: u32 = 0o011;

/// Creates `path` and its missing parents, giving each folder created here [`PASS_THROUGH`]
/// as well as what the umask left; folders that exist are left as they are.
pub fn create_reachable(path: &Path) -> io::Result<()> {
    // The missing folders, innermost first (bounded by the number of path components).
    let mut missing = Vec::new();
    for p in path.ancestors() {
        if p.as_os_str().is_empty() || p.is_dir() {
            break;
        }
        missing.push(p);
    }
    for dir in missing.into_iter().rev() {
        match fs::create_dir(dir) {
            Ok(()) => {
                let mode = fs::metadata(dir)?.permissions().mode();
                if mode & PASS_THROUGH != PASS_THROUGH {
                    fs::set_permissions(dir, fs::Permissions::from_mode(mode | PASS_THROUGH))?;
                }
            }
            // Made meanwhile by someone else (a concurrent run): not ours to change.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Under umask 077, the folders created get `--x` for group and others, and a folder that
    /// existed keeps its mode. In a child process of our own: the umask is the whole process's.
    #[test]
    fn created_folders_let_others_through_under_a_strict_umask() {
        if std::env::var_os("MESHCACHE_UMASK_CHILD").is_none() {
            let exe = std::env::current_exe().expect("test binary");
            let status = std::process::Command::new(exe)
                .args([
                    "--exact",
                    "folders::tests::created_folders_let_others_through_under_a_strict_umask",
                ])
                .env("MESHCACHE_UMASK_CHILD", "1")
                .status()
                .expect("child");
            assert!(status.success());
            return;
        }
        rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
        let given = tempfile::tempdir().expect("tempdir");
        fs::set_permissions(given.path(), fs::Permissions::from_mode(0o700)).expect("chmod");
        let deep = given.path().join("out/runs/00-x");
        create_reachable(&deep).expect("created");
        for d in ["out", "out/runs", "out/runs/00-x"] {
            let mode = fs::metadata(given.path().join(d))
                .expect("exists")
                .permissions()
                .mode()
                & 0o777;
            assert_eq!(mode, 0o711, "{d}");
        }
        let mode = fs::metadata(given.path())
            .expect("given")
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o700, "a folder that existed is left alone");
        // Again: nothing to create, nothing changed.
        create_reachable(&deep).expect("exists");
        // A file in the way is an error.
        let file = given.path().join("file");
        fs::write(&file, "").expect("write");
        assert!(create_reachable(&file.join("sub")).is_err());
    }
}
