//! The `[applets]` configuration section and the limits it sets.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Active Cache settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AppletConfig {
    /// Run applets. When off, documents that name an applet are not stored (a hit could not
    /// run their applet), and bindings are ignored.
    pub enabled: bool,
    /// CPU time a run may use before it is stopped, for a document of zero bytes.
    #[serde(with = "humantime_serde")]
    pub cpu: Duration,
    /// Extra CPU time per MiB of the document (applets that scan it need time in proportion).
    #[serde(with = "humantime_serde")]
    pub cpu_per_mib: Duration,
    /// The most CPU time a run gets, whatever the document's size.
    #[serde(with = "humantime_serde")]
    pub cpu_max: Duration,
    /// Linear memory an applet instance may grow to.
    #[serde(with = "size")]
    pub memory: u64,
    /// Largest body an applet may build (with `write` and `write_item`).
    #[serde(with = "size")]
    pub max_output: u64,
    /// Most bytes a run may copy out of the proxy into its memory (inputs, items, store reads).
    #[serde(with = "size")]
    pub max_copy: u64,
    /// Largest module the proxy fetches and compiles.
    #[serde(with = "size")]
    pub max_module: u64,
    /// Compiled modules kept (by content, and by URL); beyond it the least recently loaded
    /// is dropped (and fetched again when a hit needs it).
    pub max_modules: usize,
    /// A fetched module is used this long, then fetched again on its next use.
    #[serde(with = "humantime_serde")]
    pub module_ttl: Duration,
    /// Key/value bytes (keys plus values) one origin's applets may keep.
    #[serde(with = "size")]
    pub kv_max: u64,
    /// Log bytes one run may append.
    #[serde(with = "size")]
    pub log_per_run: u64,
    /// Log bytes held for one destination while they wait for delivery; beyond it records
    /// are dropped and counted.
    #[serde(with = "size")]
    pub log_queue: u64,
    /// Largest log batch sent in one POST.
    #[serde(with = "size")]
    pub log_batch: u64,
    /// How often pending log records are sent.
    #[serde(with = "humantime_serde")]
    pub log_interval: Duration,
    /// Longest wait between retries of a failed log delivery (the wait doubles from
    /// `log_interval` up to this).
    #[serde(with = "humantime_serde")]
    pub log_retry_max: Duration,
    /// Applet instances that may exist at once (the instance pool's size).
    pub instances: u32,
    /// Runs in a row that fault (trap, limit, invalid result) before a module is quarantined;
    /// 0 never quarantines.
    pub quarantine_after: u32,
    /// How long a quarantined module is not run (its documents' hits go to the origin).
    #[serde(with = "humantime_serde")]
    pub quarantine: Duration,
    /// Applets bound by the administrator to URL patterns, tried in order.
    #[serde(rename = "bind")]
    pub bindings: Vec<Binding>,
}

/// An administrator's binding of an applet to URLs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Binding {
    /// URL pattern: `*` matches any run of characters, e.g. `http://example.com/news/*`.
    pub urls: String,
    /// The module: a file path (read at start) or an `http://` URL of the same origin as
    /// the documents it serves.
    pub module: String,
    /// Where its log records are POSTed (default: the document's origin, at the module's
    /// path when the module is a URL, else at `/`).
    #[serde(default)]
    pub log: Option<String>,
}

impl Default for AppletConfig {
    fn default() -> Self {
        AppletConfig {
            enabled: true,
            cpu: Duration::from_millis(20),
            cpu_per_mib: Duration::from_millis(10),
            cpu_max: Duration::from_millis(200),
            memory: 16 << 20,
            max_output: 16 << 20,
            max_copy: 64 << 20,
            max_module: 4 << 20,
            max_modules: 256,
            module_ttl: Duration::from_secs(600),
            kv_max: 256 << 10,
            log_per_run: 16 << 10,
            log_queue: 1 << 20,
            log_batch: 64 << 10,
            log_interval: Duration::from_secs(1),
            log_retry_max: Duration::from_secs(60),
            instances: 256,
            quarantine_after: 5,
            quarantine: Duration::from_secs(60),
            bindings: Vec::new(),
        }
    }
}

impl AppletConfig {
    /// The CPU budget of one run over a document of `size` bytes.
    pub fn cpu_budget(&self, size: usize) -> Duration {
        // In whole nanoseconds: this runs on every hit, and integer arithmetic is exact.
        let per = (self.cpu_per_mib.as_nanos() * size as u128) >> 20;
        let total = (self.cpu.as_nanos() + per).min(self.cpu_max.as_nanos());
        Duration::from_nanos(u64::try_from(total).unwrap_or(u64::MAX))
    }

    /// Checks the values against each other: `Err((dotted key, what is wrong))`.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if self.cpu.is_zero() {
            return Err(("applets.cpu", "must be more than 0".into()));
        }
        if self.cpu_max < self.cpu {
            return Err(("applets.cpu_max", "must be at least applets.cpu".into()));
        }
        if self.cpu_max > Duration::from_secs(10) {
            return Err(("applets.cpu_max", "must be at most 10s".into()));
        }
        if self.memory < 1 << 16 || self.memory > 1 << 32 {
            return Err(("applets.memory", "must be between 64 KiB and 4 GiB".into()));
        }
        if self.max_modules == 0 {
            return Err(("applets.max_modules", "must be at least 1".into()));
        }
        if self.instances == 0 {
            return Err(("applets.instances", "must be at least 1".into()));
        }
        if self.log_batch == 0 || self.log_queue < self.log_batch {
            return Err((
                "applets.log_queue",
                "must be at least applets.log_batch, which must be more than 0".into(),
            ));
        }
        if self.log_interval.is_zero() || self.log_retry_max < self.log_interval {
            return Err((
                "applets.log_retry_max",
                "must be at least applets.log_interval, which must be more than 0".into(),
            ));
        }
        for (i, b) in self.bindings.iter().enumerate() {
            if b.urls.is_empty() {
                return Err(("applets.bind", format!("[{i}].urls is empty")));
            }
            if b.module.is_empty() {
                return Err(("applets.bind", format!("[{i}].module is empty")));
            }
        }
        Ok(())
    }
}

/// Matches `text` against a pattern where `*` stands for any run of characters.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    let mut parts: Vec<&str> = parts.collect();
    let Some(last) = parts.pop() else {
        return rest.is_empty(); // no '*' at all
    };
    for part in parts {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// Sizes in the config, as human text (`"16 MiB"`) or plain byte counts: the format of every
/// size key, shared with the proxy's own sections (`#[serde(with = "size")]`).
pub mod size {
    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes a size as IEC text ("16 MiB").
    pub fn serialize<S: Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&bytesize::ByteSize(*v).display().iec().to_string())
    }

    /// Reads a size from text ("256 MiB", "64 KiB") or a byte count.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Bytes(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Bytes(n) => Ok(n),
            Raw::Text(t) => t.parse::<bytesize::ByteSize>().map(|b| b.0).map_err(|e| {
                serde::de::Error::custom(format!(
                    "invalid size {t:?} ({e}); write e.g. \"256 MiB\""
                ))
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob_match("http://a/*", "http://a/x/y"));
        assert!(glob_match("http://a/*.html", "http://a/x/y.html"));
        assert!(!glob_match("http://a/*.html", "http://a/x/y.htm"));
        assert!(glob_match("*", ""));
        assert!(glob_match("http://a/x", "http://a/x"));
        assert!(!glob_match("http://a/x", "http://a/xy"));
        assert!(glob_match("*a*a*", "aa"));
        assert!(!glob_match("*a*a*", "a"));
        assert!(!glob_match("ab*ba", "aba"));
    }

    #[test]
    fn budget_scales_with_size_up_to_the_cap() {
        let c = AppletConfig::default();
        assert_eq!(c.cpu_budget(0), Duration::from_millis(20));
        assert_eq!(c.cpu_budget(5 << 20), Duration::from_millis(70));
        assert_eq!(c.cpu_budget(1 << 30), Duration::from_millis(200));
        assert_eq!(c.cpu_budget(1 << 19), Duration::from_millis(25));
        assert_eq!(c.cpu_budget(1), Duration::from_nanos(20_000_009));
        assert_eq!(c.cpu_budget(usize::MAX), Duration::from_millis(200));
    }

    #[test]
    fn defaults_validate_and_round_trip() {
        let c = AppletConfig::default();
        c.validate().expect("defaults are valid");
        let text = toml::to_string(&c).expect("serializes");
        let back: AppletConfig = toml::from_str(&text).expect("parses");
        assert_eq!(back, c);
    }
}
