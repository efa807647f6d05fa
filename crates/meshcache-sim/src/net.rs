//! The network model: links that serialize what crosses them, wire sizes, and time units (the
//! engine counts virtual time in ns).

use std::time::Duration;

/// Bytes of an ICP query for a URL of `url_len` bytes: header, requester field, URL, NUL
/// (the multicast and directory queries are ICP queries too).
pub(crate) fn icp_query_bytes(url_len: usize) -> u64 {
    (meshcache_wire::icp::HEADER_LEN + 4 + url_len + 1) as u64
}

/// Bytes of an ICP reply for a URL of `url_len` bytes: header, URL, NUL.
pub(crate) fn icp_reply_bytes(url_len: usize) -> u64 {
    (meshcache_wire::icp::HEADER_LEN + url_len + 1) as u64
}

/// IPv4 and UDP headers of a datagram.
pub(crate) const UDP_IP: u64 = 28;

/// A duration in ns of virtual time.
pub(crate) fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Transfer time of `bytes` at `bits_per_s` (0: instantaneous).
pub(crate) fn wire(bytes: u64, bits_per_s: u64) -> u64 {
    if bits_per_s == 0 {
        0
    } else {
        (u128::from(bytes) * 8 * 1_000_000_000 / u128::from(bits_per_s)) as u64
    }
}

/// A link (a node's interface, or the shared network) that serializes what crosses it.
///
/// A message that fits in one packet does not wait behind bulk transfers already queued: on a
/// real link it is interleaved with them packet by packet, so it waits about one packet time
/// per competing transfer rather than for whole objects and summaries. It still takes its
/// share of the link, delaying the bulk behind it. Larger messages queue first come, first
/// served.
///
/// The engine books a node's sends when it decides them, so one node's train of ICP queries is
/// booked a millisecond ahead while another node's message may then enter the link earlier. A
/// small message entering before the latest one booked does not wait for the gaps of that
/// train: it waits for the work queued ahead of it (the backlog at the latest booking), and
/// adds its own time to that backlog.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Link {
    /// When the bulk queue is next empty.
    bulk_free: u64,
    /// When the small-message queue is next empty.
    small_free: u64,
    /// The latest time a small message entered.
    small_last: u64,
}

/// The largest message that travels as one packet.
const PACKET: u64 = 1500;

impl Link {
    /// `bytes` enter the link at `t` (at `bits_per_s`; 0: instantaneous): when they are out.
    pub(crate) fn pass(&mut self, t: u64, bytes: u64, bits_per_s: u64) -> u64 {
        if bits_per_s == 0 {
            return t;
        }
        let tx = wire(bytes, bits_per_s);
        if bytes <= PACKET {
            let done = self.small_done(t, tx);
            if t >= self.small_last {
                self.small_free = done;
                self.small_last = t;
            } else {
                self.small_free += tx;
            }
            self.bulk_free = if self.bulk_free > t {
                self.bulk_free + tx
            } else {
                done
            };
            done
        } else {
            let done = t.max(self.bulk_free).max(self.small_free) + tx;
            self.bulk_free = done;
            done
        }
    }

    /// When a small message of `tx` entering at `t` would be out.
    fn small_done(&self, t: u64, tx: u64) -> u64 {
        if t >= self.small_last {
            t.max(self.small_free) + tx
        } else {
            t + self.small_free.saturating_sub(self.small_last) + tx
        }
    }

    /// When a message of `bytes` (at most a packet) entering at `t` would be out, without
    /// booking it.
    pub(crate) fn peek(&self, t: u64, bytes: u64, bits_per_s: u64) -> u64 {
        if bits_per_s == 0 {
            return t;
        }
        self.small_done(t, wire(bytes, bits_per_s))
    }

    /// Books `count` small messages of `bytes` each, entering from `first` to `last` on a
    /// convex schedule (evenly spaced, or spaced by a queue upstream): the same as `count`
    /// calls of [`Link::pass`], in closed form. Returns the train's start `b`: message `i`
    /// (entering at `in_i`) is out at `max(b + (i + 1) tx, in_i + tx)` ([`Train::out`]).
    pub(crate) fn book_train(
        &mut self,
        first: u64,
        last: u64,
        count: u64,
        bytes: u64,
        bits_per_s: u64,
    ) -> Train {
        if bits_per_s == 0 || count == 0 {
            return Train { start: 0, tx: 0 };
        }
        let tx = wire(bytes, bits_per_s);
        // The queue a message entering at `first` finds ahead of it.
        let start = self.small_done(first, 0);
        let train = Train { start, tx };
        let done = train.out(count - 1, last);
        self.bulk_free = if self.bulk_free > first {
            self.bulk_free + count * tx
        } else {
            done
        };
        if last >= self.small_last {
            self.small_free = (self.small_free + count * tx).max(done);
            self.small_last = last;
        } else {
            self.small_free += count * tx;
        }
        train
    }

    /// Adds `work` ns of small messages whose times are not tracked one by one (replies to an
    /// aggregate search): a link that was idle long enough absorbs it.
    pub(crate) fn absorb(&mut self, work: u64) {
        self.small_free += work;
        self.bulk_free += work;
    }
}

/// Where a train of small messages booked by [`Link::book_train`] leaves the link.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Train {
    start: u64,
    tx: u64,
}

impl Train {
    /// When message `i`, which entered at `entered`, is out.
    pub(crate) fn out(&self, i: u64, entered: u64) -> u64 {
        if self.tx == 0 {
            return entered;
        }
        (self.start + (i + 1) * self.tx).max(entered + self.tx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_messages_do_not_wait_behind_bulk() {
        // 8 Mb/s: a byte takes 1 µs.
        let mut link = Link::default();
        let bulk = link.pass(0, 1_000_000, 8_000_000);
        assert_eq!(bulk, 1_000_000_000, "a megabyte takes a second");
        // A datagram sent just after waits for nothing but itself…
        assert_eq!(link.pass(1_000, 100, 8_000_000), 101_000);
        // …and pushes the bulk behind it back by its own time.
        assert_eq!(
            link.pass(2_000, 10_000, 8_000_000),
            1_000_100_000 + 10_000_000
        );
        // Small messages queue among themselves.
        let mut link = Link::default();
        assert_eq!(link.pass(0, 1_000, 8_000_000), 1_000_000);
        assert_eq!(link.pass(0, 1_000, 8_000_000), 2_000_000);
        // Bulk waits for the small messages queued before it; nothing is free of charge.
        assert_eq!(link.pass(0, 2_000, 8_000_000), 4_000_000);
        assert_eq!(Link::default().pass(7, 1 << 30, 0), 7, "unlimited");
    }

    #[test]
    fn a_message_entering_early_does_not_wait_for_a_train_booked_ahead() {
        // 8 Mb/s: 100 bytes take 100 µs. A train of 10 booked from 0 to 9 ms, one a ms.
        let mut link = Link::default();
        for i in 0..10 {
            link.pass(i * 1_000_000, 100, 8_000_000);
        }
        // Another node's message at 0.5 ms waits for no gap of that train.
        assert_eq!(link.pass(500_000, 100, 8_000_000), 700_000);
    }

    proptest::proptest! {
        /// A booked train leaves as the same messages passed one by one would.
        #[test]
        fn a_train_is_its_messages_one_by_one(
            earlier in 0u64..2,
            first in 0u64..3_000_000,
            spacing in 0u64..400_000,
            count in 1u64..40,
            bytes in 1u64..1500,
            bulk in proptest::bool::ANY,
        ) {
            let bps = 8_000_000;
            let mut before = Link::default();
            // Something already queued: a bulk transfer or a small message.
            before.pass(earlier, if bulk { 100_000 } else { 600 }, bps);
            let mut one_by_one = before;
            let outs: Vec<u64> = (0..count)
                .map(|i| one_by_one.pass(first + i * spacing, bytes, bps))
                .collect();
            let mut booked = before;
            let train = booked.book_train(first, first + (count - 1) * spacing, count, bytes, bps);
            for (i, out) in outs.iter().enumerate() {
                proptest::prop_assert_eq!(train.out(i as u64, first + i as u64 * spacing), *out);
            }
            proptest::prop_assert_eq!(booked.small_free, one_by_one.small_free);
            proptest::prop_assert_eq!(booked.small_last, one_by_one.small_last);
        }
    }
}
