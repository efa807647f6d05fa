//! The counters a simulation keeps as it runs — per node, per kind of inter-cache message,
//! per outcome of a client request — below everything that counts (the engine, the nodes,
//! the protocols' upkeep) and what reports them (`results.rs`).

use serde::{Deserialize, Serialize};

/// How a client request was answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// From its own cache (or a fetch under way there).
    Local,
    /// From a sibling's cache.
    Sibling,
    /// From a parent's cache.
    Parent,
    /// From the origin.
    Miss,
}

/// Answered requests by outcome, with bytes.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Classified {
    /// Requests answered.
    pub requests: u64,
    /// Local hits.
    pub local_hits: u64,
    /// Sibling hits.
    pub sibling_hits: u64,
    /// Parent hits.
    pub parent_hits: u64,
    /// Misses (origin).
    pub misses: u64,
    /// Body bytes answered.
    pub bytes: u64,
    /// Body bytes of hits of any kind.
    pub hit_bytes: u64,
}

impl Classified {
    /// Counts one answer.
    pub fn add(&mut self, outcome: Outcome, bytes: u64) {
        self.requests += 1;
        self.bytes += bytes;
        match outcome {
            Outcome::Local => self.local_hits += 1,
            Outcome::Sibling => self.sibling_hits += 1,
            Outcome::Parent => self.parent_hits += 1,
            Outcome::Miss => self.misses += 1,
        }
        if outcome != Outcome::Miss {
            self.hit_bytes += bytes;
        }
    }
}

/// Kinds of inter-cache message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// ICP queries.
    IcpQuery,
    /// ICP replies.
    IcpReply,
    /// HTTP requests between caches (their responses' bytes are added with
    /// [`Traffic::peer_response`]).
    PeerHttp,
    /// Summary Cache delta updates (datagrams).
    Summary,
    /// Whole Summary Cache arrays fetched (one HTTP exchange each; the bytes are the array's).
    SummaryFetch,
    /// Cache Digest fetches (one HTTP exchange each; the bytes are the digest's).
    Digest,
    /// Directory datagrams (lookups, answers, add/delete updates).
    Directory,
    /// Multicast queries (one datagram per group send) and their replies.
    Multicast,
}

/// Inter-cache traffic.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Traffic {
    /// ICP queries sent.
    pub icp_queries: u64,
    /// ICP replies sent.
    pub icp_replies: u64,
    /// Bytes of ICP payload (queries and replies; no IP/UDP headers).
    pub icp_bytes: u64,
    /// HTTP requests from one cache to another.
    pub peer_http: u64,
    /// Bytes of those requests' headers and of their responses.
    pub peer_http_bytes: u64,
    /// Summary Cache update datagrams.
    pub summary_messages: u64,
    /// Their bytes.
    pub summary_bytes: u64,
    /// Whole Summary Cache arrays fetched.
    pub summary_fetches: u64,
    /// Their bytes.
    pub summary_fetch_bytes: u64,
    /// Cache Digest fetches.
    pub digest_fetches: u64,
    /// Their bytes.
    pub digest_bytes: u64,
    /// Directory datagrams.
    pub directory_messages: u64,
    /// Their bytes.
    pub directory_bytes: u64,
    /// Multicast datagrams.
    pub multicast_messages: u64,
    /// Their bytes.
    pub multicast_bytes: u64,
}

impl Traffic {
    /// Counts one message of `kind` with `bytes` of payload.
    pub fn count(&mut self, kind: Kind, bytes: u64) {
        self.count_many(kind, 1, bytes);
    }

    /// Counts `n` messages of `kind` with `bytes` of payload each.
    pub fn count_many(&mut self, kind: Kind, n: u64, bytes: u64) {
        let (messages, total) = match kind {
            Kind::IcpQuery => (&mut self.icp_queries, &mut self.icp_bytes),
            Kind::IcpReply => (&mut self.icp_replies, &mut self.icp_bytes),
            Kind::PeerHttp => (&mut self.peer_http, &mut self.peer_http_bytes),
            Kind::Summary => (&mut self.summary_messages, &mut self.summary_bytes),
            Kind::SummaryFetch => (&mut self.summary_fetches, &mut self.summary_fetch_bytes),
            Kind::Digest => (&mut self.digest_fetches, &mut self.digest_bytes),
            Kind::Directory => (&mut self.directory_messages, &mut self.directory_bytes),
            Kind::Multicast => (&mut self.multicast_messages, &mut self.multicast_bytes),
        };
        *messages += n;
        *total += n * bytes;
    }

    /// The response to a peer's HTTP request: `bytes` more between caches.
    pub fn peer_response(&mut self, bytes: u64) {
        self.peer_http_bytes += bytes;
    }

    /// Protocol datagrams: ICP queries and replies, summary updates, directory and multicast
    /// messages (what a node's `udp_sent` counts in the lab).
    pub fn datagrams(&self) -> u64 {
        self.icp_queries
            + self.icp_replies
            + self.summary_messages
            + self.directory_messages
            + self.multicast_messages
    }

    /// Bytes of those datagrams (payload, without IP and UDP headers).
    pub fn datagram_bytes(&self) -> u64 {
        self.icp_bytes + self.summary_bytes + self.directory_bytes + self.multicast_bytes
    }

    /// Inter-cache protocol messages of every kind: the datagrams and the whole summaries and
    /// digests fetched over HTTP. HTTP requests for objects are counted apart
    /// ([`Traffic::peer_http`]).
    pub fn messages(&self) -> u64 {
        self.datagrams() + self.summary_fetches + self.digest_fetches
    }

    /// Bytes of those messages.
    pub fn message_bytes(&self) -> u64 {
        self.datagram_bytes() + self.summary_fetch_bytes + self.digest_bytes
    }
}

/// Per-node counters.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct NodeStats {
    /// Client requests this node received (leaves only).
    pub client_requests: u64,
    /// HTTP requests from peers it served (hits, 504s and fetches).
    pub peer_requests: u64,
    /// Requests answered from its own store (clients' and peers').
    pub store_hits: u64,
    /// Origin fetches it made.
    pub origin_fetches: u64,
    /// Datagrams sent.
    pub datagrams_sent: u64,
    /// Datagrams received.
    pub datagrams_received: u64,
    /// Nanoseconds of CPU spent.
    pub cpu_ns: u64,
    /// Store evictions.
    pub evictions: u64,
    /// Its clients' requests answered from its own store.
    pub local_hits: u64,
    /// Its clients' requests answered from a sibling's store.
    pub sibling_hits: u64,
    /// Its clients' requests answered from a parent's store.
    pub parent_hits: u64,
}

impl NodeStats {
    /// Counts the evictions among a store's `events`.
    pub fn evicted(&mut self, events: &[meshcache_store::StoreEvent]) {
        self.evictions += events
            .iter()
            .filter(|e| matches!(e, meshcache_store::StoreEvent::Evicted { .. }))
            .count() as u64;
    }

    /// One of its clients' requests was answered so.
    pub fn count(&mut self, outcome: Outcome) {
        match outcome {
            Outcome::Local => self.local_hits += 1,
            Outcome::Sibling => self.sibling_hits += 1,
            Outcome::Parent => self.parent_hits += 1,
            Outcome::Miss => {}
        }
    }
}
