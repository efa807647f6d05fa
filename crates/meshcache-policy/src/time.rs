//! Time windows (`time`): days of the week and a span of the day, in the node's local time zone.
//!
//! `"Mon-Fri 08:00-18:00"`, `"Sat,Sun"`, `"12:00-13:30"`, or Squid's day letters
//! (`"MTWHF 08:00-18:00"`: S Sunday, M, T, W, H Thursday, F, A Saturday). A span starts at its
//! first minute and ends before its last (`08:00-18:00` holds 17:59, not 18:00); `24:00` ends a
//! day. A span that would cross midnight is two items.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::items::ItemSet;

/// A moment as rules see it: the local weekday and minute of the day.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Moment {
    /// 0 is Monday, 6 is Sunday.
    pub weekday: u8,
    /// Minutes since local midnight, 0..1440.
    pub minute: u16,
}

impl Moment {
    /// The moment of a zoned time.
    pub fn of(zoned: &jiff::Zoned) -> Self {
        Self {
            weekday: zoned.weekday().to_monday_zero_offset() as u8,
            minute: zoned.hour() as u16 * 60 + zoned.minute() as u16,
        }
    }
}

/// The local clock for rules, read once a minute: a request costs one atomic load.
#[derive(Debug, Default)]
pub struct LocalClock {
    /// The Unix minute (high bits) and the packed [`Moment`] (low 16 bits) last computed.
    cached: AtomicU64,
}

impl LocalClock {
    /// The local moment of `unix_seconds`.
    pub fn moment(&self, unix_seconds: u64) -> Moment {
        let minute = unix_seconds / 60;
        let cached = self.cached.load(Relaxed);
        if cached >> 16 == minute && cached != 0 {
            return unpack(cached as u16);
        }
        let moment = jiff::Timestamp::from_second(unix_seconds as i64)
            .map(|t| Moment::of(&t.to_zoned(jiff::tz::TimeZone::system())))
            .unwrap_or(Moment {
                weekday: 0,
                minute: 0,
            });
        self.cached
            .store(minute << 16 | u64::from(pack(moment)), Relaxed);
        moment
    }
}

fn pack(m: Moment) -> u16 {
    u16::from(m.weekday) << 11 | m.minute
}

fn unpack(v: u16) -> Moment {
    Moment {
        weekday: (v >> 11) as u8,
        minute: v & 0x7ff,
    }
}

/// A set of time windows.
#[derive(Debug, Default)]
pub struct TimeSet {
    windows: Vec<Window>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Window {
    /// Bit d is weekday d (0 Monday).
    days: u8,
    start: u16,
    end: u16,
}

const DAY_NAMES: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];
const FULL_NAMES: [&str; 7] = [
    "monday",
    "tuesday",
    "wednesday",
    "thursday",
    "friday",
    "saturday",
    "sunday",
];

/// A day's number from its name (`Mon`, `monday`), 0 for Monday.
fn day(name: &str) -> Option<u8> {
    let lower = name.to_ascii_lowercase();
    (0..7)
        .find(|&i| lower == DAY_NAMES[i] || lower == FULL_NAMES[i])
        .map(|i| i as u8)
}

fn days(spec: &str) -> Result<u8, String> {
    let mut mask = 0u8;
    let named = spec.split(',').try_for_each(|part| {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (a, b) = (day(a.trim()).ok_or(())?, day(b.trim()).ok_or(())?);
        let mut d = a;
        loop {
            mask |= 1 << d;
            if d == b {
                break;
            }
            d = (d + 1) % 7;
        }
        Ok::<(), ()>(())
    });
    if named.is_ok() {
        return Ok(mask);
    }
    // Squid's letters: S M T W H F A, Sunday first.
    let mut letters = 0u8;
    for c in spec.chars() {
        let d = match c {
            'M' => 0,
            'T' => 1,
            'W' => 2,
            'H' => 3,
            'F' => 4,
            'A' => 5,
            'S' => 6,
            _ => {
                return Err(format!(
                    "{spec:?} is not a list of days (Mon-Fri, Sat,Sun, or Squid's letters SMTWHFA)"
                ))
            }
        };
        letters |= 1 << d;
    }
    Ok(letters)
}

fn clock(s: &str) -> Result<u16, String> {
    let bad = || format!("{s:?} is not a time of day (HH:MM)");
    let (h, m) = s.split_once(':').ok_or_else(bad)?;
    let (h, m): (u16, u16) = (h.parse().map_err(|_| bad())?, m.parse().map_err(|_| bad())?);
    if m >= 60 || h > 24 || (h == 24 && m != 0) {
        return Err(bad());
    }
    Ok(h * 60 + m)
}

fn span(s: &str) -> Result<(u16, u16), String> {
    let (a, b) = s
        .split_once('-')
        .ok_or_else(|| format!("{s:?} is not a span of the day (HH:MM-HH:MM)"))?;
    let (start, end) = (clock(a.trim())?, clock(b.trim())?);
    if start >= end {
        return Err(format!(
            "{s:?} ends before it starts: write a span that crosses midnight as two items"
        ));
    }
    Ok((start, end))
}

impl ItemSet for TimeSet {
    type Probe<'a> = Moment;

    fn insert(&mut self, item: &str) -> Result<(), String> {
        let words: Vec<&str> = item.split_whitespace().collect();
        let window = match words[..] {
            [one] if one.contains(':') => {
                let (start, end) = span(one)?;
                Window {
                    days: 0x7f,
                    start,
                    end,
                }
            }
            [one] => Window {
                days: days(one)?,
                start: 0,
                end: 24 * 60,
            },
            [d, s] => {
                let (start, end) = span(s)?;
                Window {
                    days: days(d)?,
                    start,
                    end,
                }
            }
            _ => {
                return Err(
                    "expected days, a span of the day, or both (\"Mon-Fri 08:00-18:00\")".into(),
                )
            }
        };
        self.windows.push(window);
        Ok(())
    }

    fn contains(&self, m: Moment) -> bool {
        self.windows
            .iter()
            .any(|w| w.days & (1 << m.weekday) != 0 && (w.start..w.end).contains(&m.minute))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(items: &[&str]) -> TimeSet {
        let mut s = TimeSet::default();
        for i in items {
            s.insert(i).expect("valid window");
        }
        s
    }

    fn at(weekday: u8, h: u16, m: u16) -> Moment {
        Moment {
            weekday,
            minute: h * 60 + m,
        }
    }

    #[test]
    fn working_hours() {
        let s = set(&["Mon-Fri 08:00-18:00"]);
        assert!(s.contains(at(0, 8, 0)));
        assert!(s.contains(at(4, 17, 59)));
        assert!(!s.contains(at(4, 18, 0)));
        assert!(!s.contains(at(5, 12, 0)));
    }

    #[test]
    fn day_forms() {
        assert!(set(&["Sat,Sun"]).contains(at(6, 23, 59)));
        assert!(
            set(&["Fri-Mon"]).contains(at(6, 1, 0)),
            "a range wraps the week"
        );
        assert!(!set(&["Fri-Mon"]).contains(at(2, 1, 0)));
        assert!(set(&["saturday"]).contains(at(5, 0, 0)));
        let squid = set(&["SA 00:00-24:00"]);
        assert!(
            squid.contains(at(5, 3, 0))
                && squid.contains(at(6, 3, 0))
                && !squid.contains(at(0, 3, 0))
        );
        assert!(set(&["12:00-13:30"]).contains(at(3, 13, 29)));
    }

    #[test]
    fn bad_windows() {
        let mut s = TimeSet::default();
        for bad in [
            "",
            "Mon 18:00-08:00",
            "Mon 25:00-26:00",
            "Funday",
            "Mon 8-9",
            "Mon Tue 08:00-09:00",
            "MonX",
        ] {
            assert!(s.insert(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_clock_caches_a_minute() {
        let c = LocalClock::default();
        let a = c.moment(1_700_000_000);
        assert_eq!(c.moment(1_700_000_001), a);
        assert!(a.weekday < 7 && a.minute < 1440);
    }

    proptest::proptest! {
        #[test]
        fn parsing_never_panics(item in ".{0,30}") {
            let _ = TimeSet::default().insert(&item);
        }

        #[test]
        fn pack_round_trips(weekday in 0u8..7, minute in 0u16..1440) {
            let m = Moment { weekday, minute };
            proptest::prop_assert_eq!(unpack(pack(m)), m);
        }
    }
}
