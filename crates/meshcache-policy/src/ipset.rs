//! Addresses and networks (`src`, `dst`): sorted, merged ranges searched by bisection.
//!
//! A list of 100,000 networks costs a binary search of at most 17 steps; IPv4 and IPv6 are kept
//! apart, and an IPv4-mapped IPv6 client (`::ffff:10.0.0.1`, as a dual-stack listener sees an
//! IPv4 client) is matched as the IPv4 address it is.

use std::net::IpAddr;

use ipnet::IpNet;

use crate::items::ItemSet;

/// A set of IP networks.
#[derive(Debug, Default)]
pub struct IpSet {
    v4: Vec<(u32, u32)>,
    v6: Vec<(u128, u128)>,
}

impl IpSet {
    /// Whether `addr` is in one of the networks.
    pub fn contains_addr(&self, addr: IpAddr) -> bool {
        match addr {
            IpAddr::V4(a) => within(&self.v4, u32::from(a)),
            IpAddr::V6(a) => match a.to_ipv4_mapped() {
                Some(a) => within(&self.v4, u32::from(a)),
                None => within(&self.v6, u128::from(a)),
            },
        }
    }
}

fn within<T: Ord + Copy>(ranges: &[(T, T)], x: T) -> bool {
    let i = ranges.partition_point(|&(start, _)| start <= x);
    i > 0 && x <= ranges[i - 1].1
}

fn merge<T: Ord + Copy + num::Successor>(ranges: &mut Vec<(T, T)>) {
    ranges.sort_unstable();
    let mut merged: Vec<(T, T)> = Vec::with_capacity(ranges.len());
    for &(start, end) in ranges.iter() {
        match merged.last_mut() {
            Some(last) if last.1.successor().is_none_or(|next| start <= next) => {
                last.1 = last.1.max(end);
            }
            _ => merged.push((start, end)),
        }
    }
    *ranges = merged;
}

mod num {
    /// The next integer, if there is one.
    pub(super) trait Successor: Sized {
        fn successor(self) -> Option<Self>;
    }
    impl Successor for u32 {
        fn successor(self) -> Option<Self> {
            self.checked_add(1)
        }
    }
    impl Successor for u128 {
        fn successor(self) -> Option<Self> {
            self.checked_add(1)
        }
    }
}

impl ItemSet for IpSet {
    type Probe<'a> = IpAddr;

    fn insert(&mut self, item: &str) -> Result<(), String> {
        let net: IpNet = match item.parse::<IpNet>() {
            Ok(net) => net,
            Err(_) => match item.parse::<IpAddr>() {
                Ok(addr) => IpNet::from(addr),
                Err(_) => return Err("not an address or a CIDR network".into()),
            },
        };
        if net != net.trunc() {
            return Err(format!("host bits set: the network is {}", net.trunc()));
        }
        match net {
            IpNet::V4(n) => self
                .v4
                .push((u32::from(n.network()), u32::from(n.broadcast()))),
            IpNet::V6(n) => self
                .v6
                .push((u128::from(n.network()), u128::from(n.broadcast()))),
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<(), String> {
        merge(&mut self.v4);
        merge(&mut self.v6);
        Ok(())
    }

    fn contains(&self, addr: IpAddr) -> bool {
        self.contains_addr(addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(items: &[&str]) -> IpSet {
        let mut s = IpSet::default();
        for i in items {
            s.insert(i).expect("valid item");
        }
        s.finish().expect("finish");
        s
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("literal address")
    }

    #[test]
    fn networks_and_addresses() {
        let s = set(&["10.0.0.0/8", "192.168.1.7", "fc00::/7", "0.0.0.0/32"]);
        assert!(s.contains_addr(ip("10.1.2.3")));
        assert!(s.contains_addr(ip("192.168.1.7")));
        assert!(!s.contains_addr(ip("192.168.1.8")));
        assert!(s.contains_addr(ip("fd00::1")));
        assert!(!s.contains_addr(ip("2001:db8::1")));
        assert!(s.contains_addr(ip("::ffff:10.9.9.9")));
        assert!(s.contains_addr(ip("0.0.0.0")));
        assert!(!s.contains_addr(ip("11.0.0.0")));
    }

    #[test]
    fn host_bits_are_an_error() {
        let mut s = IpSet::default();
        assert!(s.insert("10.0.0.1/8").is_err());
        assert!(s.insert("example.com").is_err());
        assert!(s.insert("").is_err());
    }

    #[test]
    fn the_whole_space() {
        let s = set(&["0.0.0.0/0", "::/0"]);
        assert!(s.contains_addr(ip("255.255.255.255")));
        assert!(s.contains_addr(ip("ffff::")));
    }

    proptest::proptest! {
        #[test]
        fn agrees_with_a_linear_scan(nets in proptest::collection::vec((proptest::prelude::any::<u32>(), 0u8..=32), 0..40), probes in proptest::collection::vec(proptest::prelude::any::<u32>(), 1..40)) {
            let nets: Vec<ipnet::Ipv4Net> = nets.into_iter().map(|(a, len)| ipnet::Ipv4Net::new(a.into(), len).expect("prefix length").trunc()).collect();
            let mut s = IpSet::default();
            for n in &nets {
                s.insert(&n.to_string()).expect("valid");
            }
            s.finish().expect("finish");
            for p in probes {
                let a = std::net::Ipv4Addr::from(p);
                proptest::prop_assert_eq!(s.contains_addr(a.into()), nets.iter().any(|n| n.contains(&a)));
            }
        }
    }
}
