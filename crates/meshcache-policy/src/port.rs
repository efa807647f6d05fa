//! Ports: `443` or an inclusive range `1025-65535`.

use crate::items::ItemSet;

/// A set of port ranges.
#[derive(Debug, Default)]
pub struct PortSet {
    ranges: Vec<(u16, u16)>,
}

impl ItemSet for PortSet {
    type Probe<'a> = u16;

    fn insert(&mut self, item: &str) -> Result<(), String> {
        let parse = |s: &str| {
            s.trim()
                .parse::<u16>()
                .map_err(|_| "not a port (0-65535) or a range of ports (1025-65535)".to_owned())
        };
        let range = match item.split_once('-') {
            Some((a, b)) => (parse(a)?, parse(b)?),
            None => {
                let p = parse(item)?;
                (p, p)
            }
        };
        if range.0 > range.1 {
            return Err("the range's first port is above its last".into());
        }
        self.ranges.push(range);
        Ok(())
    }

    fn contains(&self, port: u16) -> bool {
        self.ranges.iter().any(|&(a, b)| (a..=b).contains(&port))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_and_ranges() {
        let mut s = PortSet::default();
        for i in ["80", "1025-65535", " 21 "] {
            s.insert(i).expect("valid");
        }
        assert!(s.contains(80) && s.contains(21) && s.contains(1025) && s.contains(65535));
        assert!(!s.contains(443) && !s.contains(1024));
        for bad in ["", "x", "70000", "90-80", "-1", "1-"] {
            assert!(s.insert(bad).is_err(), "{bad:?}");
        }
    }
}
