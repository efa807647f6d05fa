//! The directory-based protocol (dbDCM, "directory-limited unicast"), without I/O.
//!
//! Instead of asking every neighbour about every miss (ICP) or keeping a copy of every
//! neighbour's summary (Summary Cache), the members share one **directory**, cut in pieces: a
//! hash of the URL over the member set names the member that keeps that URL's entry — the list
//! of members holding a copy (the directory-based DCM paper, §3). Rendezvous hashing places the
//! entries, so a member that joins or leaves moves only its own share of them.
//!
//! **Search.** A local miss of `u` asks the owner `H(u)` (`DIR_GET`; no message when we own it
//! ourselves). Two variants (the paper's):
//! - [`Variant::Requester`] (1): the owner answers with the holders (`DIR_DATA`); the
//!   requester picks α of them and sends them ICP queries.
//! - [`Variant::Owner`] (2): the owner picks α holders and sends them the ICP queries on the
//!   requester's behalf ("forwarded" queries, answered straight to the requester). It tells the
//!   requester whom it asked (`DIR_DATA`, forwarded) unless it asked exactly α; with no
//!   holder at all it says so, and the requester goes on at once.
//!
//! The first HIT decides; when every expected reply is a miss, or at the deadline, the request
//! goes to the parents or the origin, as after an ICP search. α candidates are chosen
//! round-robin or at random ([`Choice`]); α = 0 means all of them (the paper's choice for
//! unreliable networks).
//!
//! **Upkeep.** Entries change on store events: an admission adds us as a holder at the owner
//! (`DIR_ADD`), an eviction or invalidation removes us (`DIR_DEL`), batched per owner
//! ([`Directory::take_updates`]). In [`UpdateMode::Optimistic`] mode the owner adds the
//! requester at `DIR_GET` time, on the bet that it will hold the object; when the fetch does not
//! end in the store, [`Directory::fetch_done`] takes it back. [`UpdateMode::Pessimistic`] adds
//! only what was stored. Holder records expire after a TTL; each member's share of the
//! directory has a fixed budget of entries, flushed LRU or LFU ([`Flush`]).
//!
//! **Trust.** Directory messages are accepted only from members' ICP addresses, and a member
//! can add or remove only itself: a stranger's or a liar's message is counted and dropped, and
//! never poisons an entry.
//!
//! A local hit never reaches this module. Time is a parameter of every call; the caller sends
//! the [`Outgoing`] messages (the proxy encodes them with `meshcache_wire::directory`).

use std::collections::{BTreeMap, HashMap};
use std::net::{SocketAddr, SocketAddrV4};
use std::time::{Duration, Instant};

use meshcache_wire::directory::Placement;
use serde::{Deserialize, Serialize};

use crate::icp::{IcpMesh, Outcome, Reply, ReplyKind};
use crate::peer::PeerId;
use crate::select::Route;

/// Which side runs the candidate queries (the paper's two search variants).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Variant {
    /// Variant 1: the owner returns the holders; the requester queries them.
    Requester,
    /// Variant 2: the owner queries the holders on the requester's behalf.
    Owner,
}

/// When a requester is entered as a holder.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UpdateMode {
    /// At lookup time, taken back if the object is not stored.
    Optimistic,
    /// Once the object is stored.
    Pessimistic,
}

/// How α candidates are picked among more holders.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Choice {
    /// In turn, spreading the load over the holders.
    RoundRobin,
    /// At random.
    Random,
}

/// Which entries make room when the directory is full.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Flush {
    /// The least recently used.
    Lru,
    /// The least frequently used (ties: the least recently used).
    Lfu,
}

/// Tuning of the directory protocol.
#[derive(Clone, Debug, PartialEq)]
pub struct DirectoryConfig {
    /// Candidates queried at most per search; 0 = every holder.
    pub alpha: u32,
    /// How candidates are picked.
    pub choice: Choice,
    /// Search variant.
    pub variant: Variant,
    /// When holders are entered.
    pub mode: UpdateMode,
    /// How long a holder record stays valid without being renewed.
    pub ttl: Duration,
    /// Entries (URLs) this member's share of the directory holds at most.
    pub max_entries: usize,
    /// Which entries go when it is full.
    pub flush: Flush,
}

/// The defaults of the proxy's and the simulator's `directory_*` settings, which take them
/// from here.
impl Default for DirectoryConfig {
    fn default() -> Self {
        DirectoryConfig {
            alpha: 1,
            choice: Choice::RoundRobin,
            variant: Variant::Requester,
            mode: UpdateMode::Pessimistic,
            ttl: Duration::from_secs(3600),
            max_entries: Self::entries_in(DEFAULT_MEMORY),
            flush: Flush::Lru,
        }
    }
}

impl DirectoryConfig {
    /// The entries `memory` bytes of directory hold, at [`ENTRY_BYTES`] each.
    pub fn entries_in(memory: u64) -> usize {
        usize::try_from(memory).unwrap_or(usize::MAX) / ENTRY_BYTES
    }

    /// Checks the settings a configuration gives (the proxy's and the simulator's alike): a
    /// record's `ttl` and the `memory` of a member's share.
    pub fn check(ttl: Duration, memory: u64) -> Result<(), BadSetting> {
        if ttl < Duration::from_secs(1) {
            return Err(BadSetting::Ttl);
        }
        if memory < ENTRY_BYTES as u64 {
            return Err(BadSetting::Memory);
        }
        Ok(())
    }
}

/// A directory setting that cannot work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BadSetting {
    /// Records would expire before they could be renewed.
    Ttl,
    /// Not even one entry fits.
    Memory,
}

impl BadSetting {
    /// Why, for the configuration's error message.
    pub fn reason(self) -> &'static str {
        match self {
            BadSetting::Ttl => "must be at least 1s",
            BadSetting::Memory => "must hold at least one entry (128 B)",
        }
    }
}

/// Memory for a member's share of the directory unless configured otherwise: 16 MiB, 131,072
/// entries.
pub const DEFAULT_MEMORY: u64 = 16 << 20;

/// Bytes one directory entry costs, as budgeted: the 16-byte key, the holder list (up to four
/// holders inline), the replacement index and the hash table's own share.
pub const ENTRY_BYTES: usize = 128;

/// A member of the directory other than us.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// Its name (the placement hash is over names).
    pub name: String,
    /// Its ICP address: its identity in directory messages.
    pub icp: SocketAddrV4,
    /// Its entry in the peer table.
    pub peer: PeerId,
}

/// A message to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outgoing {
    /// `DIR_GET`: who holds `url`?
    Get {
        /// The owner.
        to: SocketAddrV4,
        /// The search's request number.
        reqnum: u32,
        /// Enter us as a holder now.
        optimistic: bool,
        /// Query the holders for us (variant 2).
        forward: bool,
        /// At most this many candidates (0 = all).
        alpha: u32,
        /// The URL.
        url: String,
    },
    /// `DIR_DATA`: these hold it (or, forwarded, these were asked).
    Data {
        /// The requester.
        to: SocketAddrV4,
        /// Its request number, echoed.
        reqnum: u32,
        /// The listed holders were sent the queries already.
        forwarded: bool,
        /// Holders (ICP addresses).
        holders: Vec<SocketAddrV4>,
        /// The URL.
        url: String,
    },
    /// An ICP query for `url`.
    Query {
        /// The candidate (our own address: answer it ourselves).
        to: SocketAddrV4,
        /// The search's request number.
        reqnum: u32,
        /// The URL.
        url: String,
        /// Sent on behalf of this requester (variant 2): the answer goes to it.
        on_behalf_of: Option<SocketAddrV4>,
    },
    /// `DIR_ADD`: we hold these now.
    Add {
        /// Their owner.
        to: SocketAddrV4,
        /// Store keys.
        keys: Vec<[u8; 16]>,
    },
    /// `DIR_DEL`: we no longer hold these.
    Del {
        /// Their owner.
        to: SocketAddrV4,
        /// Store keys.
        keys: Vec<[u8; 16]>,
    },
}

/// What a search start gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirSearch {
    /// Its request number (0 when decided without messages).
    pub reqnum: u32,
    /// Messages to send.
    pub sends: Vec<Outgoing>,
    /// Decided, or wait for replies.
    pub outcome: Outcome,
}

/// Counters of the directory protocol.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DirStats {
    /// Searches started.
    pub searches: u64,
    /// Searches whose directory entry we keep ourselves (no `DIR_GET`).
    pub owned_locally: u64,
    /// `DIR_GET`s sent.
    pub gets_sent: u64,
    /// `DIR_GET`s answered (as owner).
    pub gets_received: u64,
    /// `DIR_DATA`s sent.
    pub data_sent: u64,
    /// `DIR_DATA`s received.
    pub data_received: u64,
    /// Candidate queries sent (by us, for us or for others).
    pub queries_sent: u64,
    /// Queries we sent on another member's behalf (variant 2).
    pub queries_forwarded: u64,
    /// Searches the directory had no holder for.
    pub empty: u64,
    /// Searches that ended in a candidate's HIT.
    pub hits: u64,
    /// Candidates that answered MISS (a stale or optimistic entry).
    pub false_entries: u64,
    /// Searches that ended at the deadline.
    pub timeouts: u64,
    /// Searches skipped because the owner is not answering.
    pub owner_down: u64,
    /// Keys sent in `DIR_ADD`.
    pub adds_sent: u64,
    /// Keys sent in `DIR_DEL`.
    pub dels_sent: u64,
    /// Keys received in `DIR_ADD`.
    pub adds_received: u64,
    /// Keys received in `DIR_DEL`.
    pub dels_received: u64,
    /// Directory messages refused: not from a member, or a member speaking for another.
    pub rejected: u64,
    /// Entries flushed to stay within the budget.
    pub flushed: u64,
    /// Holder records dropped because their TTL passed.
    pub expired: u64,
}

/// One holder of an entry.
#[derive(Clone, Copy, Debug)]
struct Holder {
    /// Member index (`MEMBER_SELF` for us).
    member: u16,
    /// When the record stops being valid.
    until: Instant,
}

const MEMBER_SELF: u16 = u16::MAX;

struct Entry {
    holders: Vec<Holder>,
    /// Replacement rank: the index key in `Table::order`.
    rank: (u64, u64),
    uses: u64,
}

/// This member's share of the directory: key → holders, bounded, LRU or LFU.
struct Table {
    entries: HashMap<[u8; 16], Entry>,
    order: BTreeMap<(u64, u64), [u8; 16]>,
    tick: u64,
    max: usize,
    flush: Flush,
    ttl: Duration,
}

impl Table {
    fn new(max: usize, flush: Flush, ttl: Duration) -> Self {
        Table {
            entries: HashMap::new(),
            order: BTreeMap::new(),
            tick: 0,
            max: max.max(1),
            flush,
            ttl,
        }
    }

    fn rank(&mut self, uses: u64) -> (u64, u64) {
        self.tick += 1;
        match self.flush {
            Flush::Lru => (0, self.tick),
            Flush::Lfu => (uses, self.tick),
        }
    }

    fn touch(&mut self, key: &[u8; 16]) {
        let Some(e) = self.entries.get_mut(key) else {
            return;
        };
        self.order.remove(&e.rank);
        e.uses += 1;
        let uses = e.uses;
        self.tick += 1;
        let rank = match self.flush {
            Flush::Lru => (0, self.tick),
            Flush::Lfu => (uses, self.tick),
        };
        if let Some(e) = self.entries.get_mut(key) {
            e.rank = rank;
        }
        self.order.insert(rank, *key);
    }

    /// Live holders of `key`, expired ones dropped.
    fn holders(&mut self, now: Instant, key: &[u8; 16], stats: &mut DirStats) -> Vec<u16> {
        let Some(e) = self.entries.get_mut(key) else {
            return Vec::new();
        };
        let before = e.holders.len();
        e.holders.retain(|h| h.until > now);
        stats.expired += (before - e.holders.len()) as u64;
        if e.holders.is_empty() {
            let rank = e.rank;
            self.entries.remove(key);
            self.order.remove(&rank);
            return Vec::new();
        }
        let found = e.holders.iter().map(|h| h.member).collect();
        self.touch(key);
        found
    }

    fn add(&mut self, now: Instant, key: [u8; 16], member: u16, stats: &mut DirStats) {
        let until = now + self.ttl;
        if let Some(e) = self.entries.get_mut(&key) {
            match e.holders.iter_mut().find(|h| h.member == member) {
                Some(h) => h.until = until,
                None => e.holders.push(Holder { member, until }),
            }
            self.touch(&key);
            return;
        }
        while self.entries.len() >= self.max {
            let Some((&rank, &victim)) = self.order.iter().next() else {
                break;
            };
            self.order.remove(&rank);
            self.entries.remove(&victim);
            stats.flushed += 1;
        }
        let rank = self.rank(1);
        self.order.insert(rank, key);
        self.entries.insert(
            key,
            Entry {
                holders: vec![Holder { member, until }],
                rank,
                uses: 1,
            },
        );
    }

    fn remove(&mut self, key: &[u8; 16], member: u16) {
        let Some(e) = self.entries.get_mut(key) else {
            return;
        };
        e.holders.retain(|h| h.member != member);
        if e.holders.is_empty() {
            let rank = e.rank;
            self.entries.remove(key);
            self.order.remove(&rank);
        }
    }
}

/// Where a search is.
#[derive(Clone, Debug)]
enum Phase {
    /// Waiting for the owner's `DIR_DATA` (and, forwarded, maybe already for replies).
    Data { owner: PeerId },
    /// Waiting for the candidates' replies.
    Replies,
}

struct Pending {
    url: String,
    host: String,
    phase: Phase,
    /// Whom replies are expected from, once known.
    expecting: Option<Vec<PeerId>>,
    /// Replies in (misses).
    replied: Vec<PeerId>,
    /// Variant 2 without a `DIR_DATA`: the owner asked exactly α.
    forwarded: bool,
}

/// The directory protocol state of one member.
pub struct Directory {
    me: SocketAddrV4,
    /// Our name, then the members' (the placement hash's input).
    placement: Placement,
    members: Vec<Member>,
    by_addr: HashMap<SocketAddrV4, u16>,
    config: DirectoryConfig,
    table: Table,
    pending: HashMap<u32, Pending>,
    /// Keys we were entered for optimistically, awaiting the store's word.
    optimistic: HashMap<[u8; 16], Instant>,
    /// Updates to send, per owner (member index): key → added (true) or removed (false).
    updates: BTreeMap<u16, HashMap<[u8; 16], bool>>,
    rr: u64,
    rng: u64,
    stats: DirStats,
}

impl Directory {
    /// A member called `my_name`, reachable at `me`, sharing the directory with `members`.
    /// `seed` drives the random choice of candidates.
    pub fn new(
        my_name: &str,
        me: SocketAddrV4,
        members: Vec<Member>,
        config: DirectoryConfig,
        seed: u64,
    ) -> Self {
        let by_addr = members
            .iter()
            .enumerate()
            .map(|(i, m)| (m.icp, i as u16))
            .collect();
        Directory {
            me,
            placement: Placement::new(
                std::iter::once(my_name.to_owned())
                    .chain(members.iter().map(|m| m.name.clone()))
                    .collect(),
            ),
            members,
            by_addr,
            table: Table::new(config.max_entries, config.flush, config.ttl),
            config,
            pending: HashMap::new(),
            optimistic: HashMap::new(),
            updates: BTreeMap::new(),
            rr: 0,
            rng: seed | 1,
            stats: DirStats::default(),
        }
    }

    /// Counters.
    pub fn stats(&self) -> &DirStats {
        &self.stats
    }

    /// Entries in our share of the directory.
    pub fn entries(&self) -> usize {
        self.table.entries.len()
    }

    /// The members, not counting us.
    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// Our own ICP address.
    pub fn me(&self) -> SocketAddrV4 {
        self.me
    }

    /// Searches in flight.
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// The member keeping `key`'s entry (`MEMBER_SELF` for us).
    fn owner_of(&self, key: &[u8; 16]) -> u16 {
        match self.placement.owner_index(key) {
            Some(0) | None => MEMBER_SELF,
            Some(i) => (i - 1) as u16,
        }
    }

    /// Whether we keep `key`'s entry ourselves.
    pub fn owns(&self, key: &[u8; 16]) -> bool {
        self.owner_of(key) == MEMBER_SELF
    }

    fn addr_of(&self, member: u16) -> SocketAddrV4 {
        if member == MEMBER_SELF {
            self.me
        } else {
            self.members[member as usize].icp
        }
    }

    fn next_random(&mut self) -> u64 {
        // xorshift64*
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Picks at most `alpha` of `holders` (0: all).
    fn choose(&mut self, mut holders: Vec<u16>, alpha: u32) -> Vec<u16> {
        let alpha = alpha as usize;
        if alpha == 0 || holders.len() <= alpha {
            return holders;
        }
        match self.config.choice {
            Choice::RoundRobin => {
                holders.sort_unstable();
                let start = (self.rr % holders.len() as u64) as usize;
                self.rr += 1;
                holders.rotate_left(start);
                holders.truncate(alpha);
            }
            Choice::Random => {
                for i in 0..alpha {
                    let left = (holders.len() - i) as u64;
                    let j = i + (self.next_random() % left) as usize;
                    holders.swap(i, j);
                }
                holders.truncate(alpha);
            }
        }
        holders
    }

    /// Starts the search for a miss of `url` (store key `key`, host `host`). Requests that may
    /// not consult siblings (`hierarchical` false) go to the parents or the origin at once.
    pub fn begin(
        &mut self,
        now: Instant,
        mesh: &mut IcpMesh,
        url: &str,
        key: &[u8; 16],
        host: &str,
        hierarchical: bool,
    ) -> DirSearch {
        if !hierarchical || self.members.is_empty() {
            return decided(mesh.route(now, host, None, false));
        }
        self.stats.searches += 1;
        let optimistic = self.config.mode == UpdateMode::Optimistic;
        let owner = self.owner_of(key);
        if owner == MEMBER_SELF {
            self.stats.owned_locally += 1;
            let holders = self.table.holders(now, key, &mut self.stats);
            if optimistic {
                self.table.add(now, *key, MEMBER_SELF, &mut self.stats);
                self.optimistic.insert(*key, now);
            }
            let holders: Vec<u16> = holders.into_iter().filter(|&m| m != MEMBER_SELF).collect();
            let chosen = self.choose(holders, self.config.alpha);
            return self.query(now, mesh, None, url, host, chosen);
        }
        let owner_peer = self.members[owner as usize].peer;
        let dead_after = mesh.config().dead_after;
        let alive = mesh.peers()[owner_peer.0].icp_alive(now, dead_after);
        if !alive {
            // Not heard from yet, or silent too long: as ICP does with such a peer, the lookup
            // still goes out (its answer revives the owner) but the request does not wait.
            self.stats.owner_down += 1;
        }
        let reqnum = mesh.next_reqnum();
        mesh.note_query(now, owner_peer, reqnum, alive);
        let forward = self.config.variant == Variant::Owner;
        let get = Outgoing::Get {
            to: self.members[owner as usize].icp,
            reqnum,
            optimistic,
            forward,
            alpha: self.config.alpha,
            url: url.to_owned(),
        };
        self.stats.gets_sent += 1;
        if optimistic {
            self.optimistic.insert(*key, now);
        }
        if !alive {
            let route = mesh.route(now, host, None, false);
            return DirSearch {
                reqnum,
                sends: vec![get],
                outcome: Outcome::Decided(route),
            };
        }
        // One wait for the owner's answer and one for the candidates'.
        let deadline = now + 2 * mesh.wait_for(&[owner_peer]);
        self.pending.insert(
            reqnum,
            Pending {
                url: url.to_owned(),
                host: host.to_owned(),
                phase: Phase::Data { owner: owner_peer },
                expecting: None,
                replied: Vec::new(),
                forwarded: forward,
            },
        );
        DirSearch {
            reqnum,
            sends: vec![get],
            outcome: Outcome::Wait { deadline },
        }
    }

    /// Sends the candidate queries of a search we run ourselves (under `reqnum`, or a new
    /// request number).
    fn query(
        &mut self,
        now: Instant,
        mesh: &mut IcpMesh,
        reqnum: Option<u32>,
        url: &str,
        host: &str,
        chosen: Vec<u16>,
    ) -> DirSearch {
        if chosen.is_empty() {
            self.stats.empty += 1;
            return decided(mesh.route(now, host, None, false));
        }
        let reqnum = reqnum.unwrap_or_else(|| mesh.next_reqnum());
        let peers: Vec<PeerId> = chosen
            .iter()
            .map(|&m| self.members[m as usize].peer)
            .collect();
        let sends = chosen
            .iter()
            .map(|&m| Outgoing::Query {
                to: self.members[m as usize].icp,
                reqnum,
                url: url.to_owned(),
                on_behalf_of: None,
            })
            .collect();
        for &p in &peers {
            mesh.note_query(now, p, reqnum, true);
        }
        self.stats.queries_sent += peers.len() as u64;
        let deadline = now + mesh.wait_for(&peers);
        self.pending.insert(
            reqnum,
            Pending {
                url: url.to_owned(),
                host: host.to_owned(),
                phase: Phase::Replies,
                expecting: Some(peers),
                replied: Vec::new(),
                forwarded: false,
            },
        );
        DirSearch {
            reqnum,
            sends,
            outcome: Outcome::Wait { deadline },
        }
    }

    /// The owner's `DIR_DATA` for search `reqnum` arrived from `from`. Returns the messages to
    /// send (variant 1: the candidate queries) and the route when this decides the search.
    pub fn on_data(
        &mut self,
        now: Instant,
        mesh: &mut IcpMesh,
        from: SocketAddr,
        reqnum: u32,
        forwarded: bool,
        holders: &[SocketAddrV4],
    ) -> (Vec<Outgoing>, Option<Route>) {
        let Some(sender) = self.member_at(from) else {
            self.stats.rejected += 1;
            return (Vec::new(), None);
        };
        self.stats.data_received += 1;
        let sender_peer = self.members[sender as usize].peer;
        mesh.note_alive(now, sender_peer, reqnum);
        let Some(p) = self.pending.get(&reqnum) else {
            return (Vec::new(), None);
        };
        match p.phase {
            Phase::Data { owner } if owner == sender_peer => {}
            _ => {
                self.stats.rejected += 1;
                return (Vec::new(), None);
            }
        }
        let members: Vec<u16> = holders
            .iter()
            .filter(|&&a| a != self.me)
            .filter_map(|a| self.by_addr.get(a).copied())
            .collect();
        if forwarded {
            let peers: Vec<PeerId> = members
                .iter()
                .map(|&m| self.members[m as usize].peer)
                .collect();
            let Some(p) = self.pending.get_mut(&reqnum) else {
                return (Vec::new(), None);
            };
            p.phase = Phase::Replies;
            p.expecting = Some(peers);
            return (Vec::new(), self.all_in(now, mesh, reqnum));
        }
        let Some(p) = self.pending.remove(&reqnum) else {
            return (Vec::new(), None);
        };
        let chosen = self.choose(members, self.config.alpha);
        let search = self.query(now, mesh, Some(reqnum), &p.url, &p.host, chosen);
        match search.outcome {
            Outcome::Decided(route) => (search.sends, Some(route)),
            Outcome::Wait { .. } => (search.sends, None),
        }
    }

    /// An ICP reply arrived from `from`. `None`: not one of our searches (the caller may give it
    /// to ICP). `Some(route)`: ours, and `route` is set when it decides the search.
    pub fn on_reply(
        &mut self,
        now: Instant,
        mesh: &mut IcpMesh,
        from: SocketAddr,
        reply: Reply<'_>,
    ) -> Option<Option<Route>> {
        let p = self.pending.get(&reply.reqnum)?;
        if p.url != reply.url {
            return None;
        }
        let Some(id) = mesh.peer_at(from) else {
            return Some(None);
        };
        mesh.note_reply(now, id, reply.kind, reply.reqnum);
        let Some(p) = self.pending.get_mut(&reply.reqnum) else {
            return Some(None);
        };
        if p.replied.contains(&id) {
            return Some(None);
        }
        if let Phase::Data { owner } = p.phase {
            // Variant 2: a candidate the owner asked for us answered, so the owner is alive
            // (it sends us nothing itself when it asked exactly α).
            mesh.note_alive(now, owner, reply.reqnum);
        }
        let Some(p) = self.pending.get_mut(&reply.reqnum) else {
            return Some(None);
        };
        if reply.kind == ReplyKind::Hit {
            let p = self.pending.remove(&reply.reqnum)?;
            self.stats.hits += 1;
            return Some(Some(mesh.hit_route(now, &p.host, id)));
        }
        self.stats.false_entries += 1;
        p.replied.push(id);
        Some(self.all_in(now, mesh, reply.reqnum))
    }

    /// Decides search `reqnum` if every expected reply is in.
    fn all_in(&mut self, now: Instant, mesh: &mut IcpMesh, reqnum: u32) -> Option<Route> {
        let p = self.pending.get(&reqnum)?;
        let done = match (&p.expecting, &p.phase) {
            (Some(e), Phase::Replies) => e.iter().all(|id| p.replied.contains(id)),
            // Forwarded without a DIR_DATA: the owner asked exactly α.
            (None, Phase::Data { .. }) if p.forwarded && self.config.alpha > 0 => {
                p.replied.len() >= self.config.alpha as usize
            }
            _ => false,
        };
        if !done {
            return None;
        }
        let p = self.pending.remove(&reqnum)?;
        if p.expecting.as_ref().is_some_and(Vec::is_empty) {
            self.stats.empty += 1;
        }
        Some(mesh.route(now, &p.host, None, false))
    }

    /// The deadline of search `reqnum` passed: the parents or the origin, if still undecided.
    pub fn on_deadline(&mut self, now: Instant, mesh: &mut IcpMesh, reqnum: u32) -> Option<Route> {
        let p = self.pending.remove(&reqnum)?;
        self.stats.timeouts += 1;
        let silent: Vec<PeerId> = match (&p.phase, &p.expecting) {
            (Phase::Data { owner }, _) => vec![*owner],
            (Phase::Replies, Some(e)) => e
                .iter()
                .copied()
                .filter(|id| !p.replied.contains(id))
                .collect(),
            (Phase::Replies, None) => Vec::new(),
        };
        for id in silent {
            mesh.peers_mut()[id.0].stats.timeouts += 1;
        }
        Some(mesh.route(now, &p.host, None, true))
    }

    /// The requester went away: forget the search.
    pub fn abandon(&mut self, reqnum: u32) {
        self.pending.remove(&reqnum);
    }

    /// Whether `reqnum` is one of our searches in flight.
    pub fn is_searching(&self, reqnum: u32) -> bool {
        self.pending.contains_key(&reqnum)
    }

    fn member_at(&self, from: SocketAddr) -> Option<u16> {
        match from {
            SocketAddr::V4(a) => self.by_addr.get(&a).copied(),
            SocketAddr::V6(_) => None,
        }
    }

    /// A `DIR_GET` from `from` (as the owner of `key`'s entry). Returns what to send: the
    /// holders to the requester (variant 1), or the forwarded queries and, unless exactly α
    /// were asked, the list of them to the requester (variant 2). Non-members get nothing.
    #[allow(clippy::too_many_arguments)]
    pub fn on_get(
        &mut self,
        now: Instant,
        from: SocketAddr,
        requester: SocketAddrV4,
        reqnum: u32,
        optimistic: bool,
        forward: bool,
        alpha: u32,
        url: &str,
        key: &[u8; 16],
    ) -> Vec<Outgoing> {
        let Some(asker) = self.member_at(from) else {
            self.stats.rejected += 1;
            return Vec::new();
        };
        if self.members[asker as usize].icp != requester {
            // A member may search only for itself.
            self.stats.rejected += 1;
            return Vec::new();
        }
        self.stats.gets_received += 1;
        let holders: Vec<u16> = self
            .table
            .holders(now, key, &mut self.stats)
            .into_iter()
            .filter(|&m| m != asker)
            .collect();
        if optimistic {
            self.table.add(now, *key, asker, &mut self.stats);
        }
        if !forward {
            self.stats.data_sent += 1;
            return vec![Outgoing::Data {
                to: requester,
                reqnum,
                forwarded: false,
                holders: holders.into_iter().map(|m| self.addr_of(m)).collect(),
                url: url.to_owned(),
            }];
        }
        // The requester's α, not ours.
        let chosen = self.choose(holders, alpha);
        let mut sends: Vec<Outgoing> = chosen
            .iter()
            .map(|&m| Outgoing::Query {
                to: self.addr_of(m),
                reqnum,
                url: url.to_owned(),
                on_behalf_of: Some(requester),
            })
            .collect();
        self.stats.queries_sent += chosen.len() as u64;
        self.stats.queries_forwarded += chosen.len() as u64;
        if alpha == 0 || chosen.len() < alpha as usize {
            self.stats.data_sent += 1;
            sends.push(Outgoing::Data {
                to: requester,
                reqnum,
                forwarded: true,
                holders: chosen.iter().map(|&m| self.addr_of(m)).collect(),
                url: url.to_owned(),
            });
        }
        sends
    }

    /// A `DIR_ADD` (`add`) or `DIR_DEL` from `from` for `holder` and `keys`. Only a member
    /// speaking for itself is heard. Returns whether it was accepted.
    pub fn on_update(
        &mut self,
        now: Instant,
        from: SocketAddr,
        holder: SocketAddrV4,
        add: bool,
        keys: &[[u8; 16]],
    ) -> bool {
        let Some(member) = self.member_at(from) else {
            self.stats.rejected += 1;
            return false;
        };
        if self.members[member as usize].icp != holder {
            self.stats.rejected += 1;
            return false;
        }
        for key in keys {
            if add {
                self.table.add(now, *key, member, &mut self.stats);
            } else {
                self.table.remove(key, member);
            }
        }
        if add {
            self.stats.adds_received += keys.len() as u64;
        } else {
            self.stats.dels_received += keys.len() as u64;
        }
        true
    }

    /// Which address a forwarded query (variant 2) from `from` should be answered at: the
    /// requester it names, if both are members; `None` otherwise (answer the sender, or not at
    /// all).
    pub fn forwarded_reply_to(
        &self,
        from: SocketAddr,
        requester: SocketAddrV4,
    ) -> Option<SocketAddr> {
        self.member_at(from)?;
        self.by_addr
            .contains_key(&requester)
            .then_some(SocketAddr::V4(requester))
    }

    /// The store admitted `key`: we hold it now.
    pub fn on_admitted(&mut self, now: Instant, key: [u8; 16]) {
        if self.optimistic.remove(&key).is_some() {
            // The owner entered us at lookup time.
            return;
        }
        self.update(now, key, true);
    }

    /// The store dropped `key` (evicted or invalidated).
    pub fn on_removed(&mut self, now: Instant, key: [u8; 16]) {
        self.optimistic.remove(&key);
        self.update(now, key, false);
    }

    /// A miss of `key` ended; `stored` tells whether the store kept what came back. An
    /// optimistic entry for an object we did not keep is taken back.
    pub fn fetch_done(&mut self, now: Instant, key: [u8; 16], stored: bool) {
        // Optimistic bets older than a minute are settled one way or the other by now (a
        // capture that was cut short never reaches the store, nor this call with `false`).
        if self.optimistic.len() > 4096 {
            self.optimistic
                .retain(|_, t| now.saturating_duration_since(*t) < Duration::from_secs(60));
        }
        if !stored && self.optimistic.remove(&key).is_some() {
            self.update(now, key, false);
        }
    }

    fn update(&mut self, now: Instant, key: [u8; 16], add: bool) {
        let owner = self.owner_of(&key);
        if owner == MEMBER_SELF {
            if add {
                self.table.add(now, key, MEMBER_SELF, &mut self.stats);
            } else {
                self.table.remove(&key, MEMBER_SELF);
            }
            return;
        }
        self.updates.entry(owner).or_default().insert(key, add);
    }

    /// Updates waiting to go out.
    pub fn queued_updates(&self) -> usize {
        self.updates.values().map(HashMap::len).sum()
    }

    /// The queued updates, as one `DIR_ADD` and one `DIR_DEL` per owner at most (the caller
    /// cuts them into datagrams). An add and a remove of one key since the last call cancel to
    /// the later.
    pub fn take_updates(&mut self) -> Vec<Outgoing> {
        let mut out = Vec::new();
        for (owner, keys) in std::mem::take(&mut self.updates) {
            let to = self.members[owner as usize].icp;
            let (mut adds, mut dels) = (Vec::new(), Vec::new());
            for (key, add) in keys {
                if add {
                    adds.push(key);
                } else {
                    dels.push(key);
                }
            }
            adds.sort_unstable();
            dels.sort_unstable();
            self.stats.adds_sent += adds.len() as u64;
            self.stats.dels_sent += dels.len() as u64;
            if !adds.is_empty() {
                out.push(Outgoing::Add { to, keys: adds });
            }
            if !dels.is_empty() {
                out.push(Outgoing::Del { to, keys: dels });
            }
        }
        out
    }
}

fn decided(route: Route) -> DirSearch {
    DirSearch {
        reqnum: 0,
        sends: Vec::new(),
        outcome: Outcome::Decided(route),
    }
}

#[cfg(test)]
mod tests;
mod upkeep;

pub use upkeep::{Upkeep, DRAIN_INTERVAL};
