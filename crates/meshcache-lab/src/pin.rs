//! Pinning to CPUs: the `taskset -c` list syntax, checked when an experiment is read, and the
//! lab's own process pinned with it (its clients and origins run in the lab's threads, and
//! must not share the nodes' core).

use std::io;

use rustix::thread::Pid;
use rustix::thread::{sched_setaffinity, CpuSet};

/// The CPUs of a `taskset -c` list: numbers and ranges separated by commas (`"0"`, `"0-1"`,
/// `"0,2-3"`), in ascending order, each below [`CpuSet::MAX_CPU`].
pub fn parse_cpu_list(list: &str) -> Result<Vec<usize>, String> {
    let mut cpus = Vec::new();
    for part in list.split(',') {
        let part = part.trim();
        let number = |s: &str| -> Result<usize, String> {
            let n: usize = s
                .trim()
                .parse()
                .map_err(|_| format!("{s:?} is not a CPU number"))?;
            if n >= CpuSet::MAX_CPU {
                return Err(format!(
                    "CPU {n} is beyond the largest, {}",
                    CpuSet::MAX_CPU - 1
                ));
            }
            Ok(n)
        };
        let (first, last) = match part.split_once('-') {
            Some((a, b)) => (number(a)?, number(b)?),
            None => {
                let n = number(part)?;
                (n, n)
            }
        };
        if first > last {
            return Err(format!("{part:?}: the range runs backwards"));
        }
        cpus.extend(first..=last);
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

/// Pins every thread of this process to the CPUs of `list` (threads started later inherit
/// it from the thread that starts them).
pub fn pin_this_process(list: &str) -> io::Result<()> {
    let cpus = parse_cpu_list(list).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let mut set = CpuSet::new();
    for cpu in cpus {
        set.set(cpu);
    }
    let mut pinned = 0;
    for entry in std::fs::read_dir("/proc/self/task")? {
        let tid = entry?.file_name().to_string_lossy().parse::<i32>().ok();
        if let Some(pid) = tid.and_then(Pid::from_raw) {
            // A thread that ended since the listing is no error.
            match sched_setaffinity(Some(pid), &set) {
                Ok(()) => pinned += 1,
                Err(rustix::io::Errno::SRCH) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    if pinned == 0 {
        sched_setaffinity(None, &set)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_read_as_taskset_reads_them() {
        assert_eq!(parse_cpu_list("0"), Ok(vec![0]));
        assert_eq!(parse_cpu_list("0-1"), Ok(vec![0, 1]));
        assert_eq!(parse_cpu_list("3, 0-1,1"), Ok(vec![0, 1, 3]));
        for bad in ["", "a", "1-", "2-1", "0,,1", "-1", "99999"] {
            assert!(parse_cpu_list(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn pinning_takes_effect_on_every_thread() {
        // In a child process of our own: pinning the test binary would pin the other tests.
        if std::env::var_os("MESHCACHE_PIN_CHILD").is_none() {
            let exe = std::env::current_exe().expect("test binary");
            let status = std::process::Command::new(exe)
                .args([
                    "--exact",
                    "pin::tests::pinning_takes_effect_on_every_thread",
                ])
                .env("MESHCACHE_PIN_CHILD", "1")
                .status()
                .expect("child");
            assert!(status.success());
            return;
        }
        let worker =
            std::thread::spawn(|| std::thread::sleep(std::time::Duration::from_millis(200)));
        pin_this_process("0").expect("pin");
        let allowed = |tid: &str| -> String {
            let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status"))
                .unwrap_or_default();
            status
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .unwrap_or("?")
                .trim()
                .to_owned()
        };
        for entry in std::fs::read_dir("/proc/self/task").expect("tasks") {
            let tid = entry
                .expect("task")
                .file_name()
                .to_string_lossy()
                .into_owned();
            assert_eq!(allowed(&tid), "0", "thread {tid}");
        }
        // A thread started afterwards inherits it.
        let later = std::thread::spawn(|| {
            std::fs::read_to_string("/proc/thread-self/status")
                .unwrap_or_default()
                .lines()
                .find_map(|l| {
                    l.strip_prefix("Cpus_allowed_list:")
                        .map(|v| v.trim().to_owned())
                })
        })
        .join()
        .expect("thread");
        assert_eq!(later.as_deref(), Some("0"));
        worker.join().expect("worker");
    }
}
