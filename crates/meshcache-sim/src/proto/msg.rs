//! The messages the protocols' upkeep sends between nodes: plain data, below every file that
//! makes or reads them (the engine carries them as they are).

use std::fmt;
use std::net::SocketAddrV4;
use std::sync::Arc;

use meshcache_wire::directory::KEY_LEN;

/// A protocol message between nodes.
#[derive(Debug)]
pub(crate) enum Msg {
    /// Directory datagrams (and the queries an owner forwards).
    Directory(DirMsg),
    /// Multicast queries.
    Multicast(McMsg),
    /// Summary Cache updates, and whole summaries or digests fetched.
    Summary(SummaryMsg),
}

/// A directory datagram between members.
#[derive(Debug)]
pub(crate) enum DirMsg {
    /// `DIR_GET`: who holds `obj`? For the sender's search `reqnum`.
    Get {
        obj: u32,
        reqnum: u32,
        optimistic: bool,
        forward: bool,
        alpha: u32,
    },
    /// `DIR_DATA`: the holders of `obj` (or, `forwarded`, the ones the owner asked).
    Data {
        obj: u32,
        reqnum: u32,
        forwarded: bool,
        holders: Vec<SocketAddrV4>,
    },
    /// One `DIR_ADD` (`add`) or `DIR_DEL` datagram: `holder` holds these keys now (or no
    /// longer).
    Update {
        add: bool,
        holder: SocketAddrV4,
        keys: Vec<[u8; KEY_LEN]>,
    },
    /// Search variant 2: an ICP query for `obj` the owner sends on `requester`'s behalf (flag
    /// `FORWARDED_QUERY`), to be answered to the requester.
    ForwardedQuery {
        obj: u32,
        reqnum: u32,
        requester: SocketAddrV4,
    },
}

/// A multicast message.
#[derive(Debug)]
pub(crate) enum McMsg {
    /// The query for `obj` of the sender's search `reqnum` (flag `MULTICAST_QUERY`: answer a
    /// hit only).
    Query { obj: u32, reqnum: u32 },
}

/// Encoded bytes, shared by every copy of a message.
#[derive(Clone)]
pub(crate) struct Body(pub(crate) Arc<[u8]>);

impl fmt::Debug for Body {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} bytes", self.0.len())
    }
}

/// A summary message between nodes.
#[derive(Debug)]
pub(crate) enum SummaryMsg {
    /// An `ICP_OP_DIRUPDATE` datagram, as the sender encoded it.
    Update(Body),
    /// `GET /meshcache-internal/summary` (summary) or
    /// `/squid-internal-periodic/store_digest` (digest).
    Fetch,
    /// Its response: the body of a 200 (`None`: an error status), and a digest's `Expires`
    /// (virtual ns, whole seconds).
    Fetched {
        body: Option<Body>,
        expires: Option<u64>,
    },
}
