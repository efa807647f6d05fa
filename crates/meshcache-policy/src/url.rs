//! URL regular expressions (`url_regex`), all of a matcher's compiled into one `RegexSet`: one
//! pass over the URL whatever their number. The `regex` crate's syntax and guarantees (linear
//! time in the URL's length, no backtracking blow-up on hostile URLs); `(?i)` makes an
//! expression case-insensitive, as Squid's `url_regex -i`.

use regex::RegexSet;

use crate::items::ItemSet;

/// URL patterns.
#[derive(Debug, Default)]
pub struct UrlSet {
    patterns: Vec<String>,
    set: Option<RegexSet>,
}

/// The most memory one matcher's compiled expressions may take.
const SIZE_LIMIT: usize = 64 << 20;

impl ItemSet for UrlSet {
    type Probe<'a> = &'a str;

    fn insert(&mut self, item: &str) -> Result<(), String> {
        // Each is checked alone, so an error names the expression at fault.
        regex::Regex::new(item).map_err(|e| e.to_string())?;
        self.patterns.push(item.to_owned());
        Ok(())
    }

    fn finish(&mut self) -> Result<(), String> {
        let set = regex::RegexSetBuilder::new(&self.patterns)
            .size_limit(SIZE_LIMIT)
            .build()
            .map_err(|e| format!("the expressions together: {e}"))?;
        self.set = Some(set);
        Ok(())
    }

    fn contains(&self, url: &str) -> bool {
        self.set.as_ref().is_some_and(|s| s.is_match(url))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_and_case() {
        let mut s = UrlSet::default();
        s.insert(r"\.exe$").expect("regex");
        s.insert(r"(?i)/ADS/").expect("regex");
        s.finish().expect("set");
        assert!(s.contains("http://x/setup.exe"));
        assert!(!s.contains("http://x/setup.EXE"));
        assert!(s.contains("http://x/ads/banner.png"));
        assert!(!s.contains("http://x/page"));
        assert!(s.insert("(unclosed").is_err());
    }
}
