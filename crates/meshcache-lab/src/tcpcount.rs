//! TCP segments sent and received per node, from the kernel's own per-socket counters.
//!
//! Every node has an address of its own, and every one of its connections has that address as
//! its local end: clients and peers connect to it, and its connections to origins and peers
//! leave from it (meshcache's `upstream.source_address`, Squid's `tcp_outgoing_address`). The
//! kernel counts each TCP socket's segments (`tcp_info`'s `tcpi_segs_out` and `tcpi_segs_in`),
//! and the sock_diag netlink interface reports them for the live sockets (a dump) and for each
//! socket as it is destroyed (the `SKNLGRP_INET_TCP_DESTROY` group). So a measured phase is:
//! a dump at its start, every socket destroyed during it, and a dump at its end; a socket
//! counts its last figures (live at the end, or when destroyed) minus those at the start (zero
//! if it was born during the phase), summed by local address ([`per_address`]).
//!
//! This is what the Summary Cache paper's `netstat` counted on each proxy's machine, without
//! giving each node a machine (or a namespace) of its own. Listening to destroyed sockets needs
//! `CAP_NET_ADMIN` in the network namespace, which a lab run in a namespace of its own (or as
//! root) has; without it there are no per-node TCP figures ([`TcpMonitor::start`] fails).

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_DUMP, NLM_F_REQUEST,
};
use netlink_packet_sock_diag::constants::{AF_INET, IPPROTO_TCP};
use netlink_packet_sock_diag::inet::{
    nlas::Nla, ExtensionFlags, InetRequest, InetResponse, SocketId, StateFlags,
};
use netlink_packet_sock_diag::SockDiagMessage;
use netlink_sys::{protocols::NETLINK_SOCK_DIAG, Socket, SocketAddr};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

/// `SKNLGRP_INET_TCP_DESTROY` (linux/sock_diag.h): IPv4 TCP sockets, as they are destroyed.
const GROUP_INET_TCP_DESTROY: u32 = 1;
/// Offsets of `tcpi_segs_out` and `tcpi_segs_in` in `struct tcp_info` (linux/tcp.h, since 4.2).
const SEGS_OUT_AT: usize = 136;
const SEGS_IN_AT: usize = 140;
/// How long destroy events may take to arrive (the kernel sends them from a work queue).
const SETTLE: Duration = Duration::from_millis(100);

/// One socket's counters, as the kernel reported them last.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SocketSegments {
    /// Its local address.
    pub local: IpAddr,
    /// Segments it sent (`tcpi_segs_out`; wraps at 2^32).
    pub segs_out: u32,
    /// Segments it received (`tcpi_segs_in`).
    pub segs_in: u32,
}

/// Sockets by their kernel cookie (unique while the system runs; never reused).
pub type Sockets = HashMap<u64, SocketSegments>;

/// TCP segments one address sent and received over a phase.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segments {
    /// Segments sent.
    pub sent: u64,
    /// Segments received.
    pub received: u64,
}

/// Each local address's segments over a phase: `start` is the dump at its start, `live` the
/// dump at its end, `destroyed` the sockets destroyed in between (their last figures).
pub fn per_address(
    start: &Sockets,
    live: &Sockets,
    destroyed: &Sockets,
) -> HashMap<IpAddr, Segments> {
    let mut out: HashMap<IpAddr, Segments> = HashMap::new();
    let last = destroyed.iter().chain(
        live.iter()
            .filter(|(cookie, _)| !destroyed.contains_key(cookie)),
    );
    for (cookie, end) in last {
        let (out0, in0) = start
            .get(cookie)
            .map_or((0, 0), |s| (s.segs_out, s.segs_in));
        let e = out.entry(end.local).or_default();
        e.sent += u64::from(end.segs_out.wrapping_sub(out0));
        e.received += u64::from(end.segs_in.wrapping_sub(in0));
    }
    out
}

/// Reads a socket's segment counters from its `INET_DIAG_INFO` attribute (`struct tcp_info`),
/// `None` when the attribute is missing or too short (kernels before 4.2, or a socket in
/// TIME_WAIT, whose minimal record has no `tcp_info`).
fn segments_of(r: &InetResponse) -> Option<SocketSegments> {
    let info = r.nlas.iter().find_map(|n| match n {
        Nla::TcpInfo(bytes) => Some(bytes),
        _ => None,
    })?;
    let word = |at: usize| -> Option<u32> {
        let b = info.get(at..at + 4)?;
        Some(u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
    };
    Some(SocketSegments {
        local: r.header.socket_id.source_address,
        segs_out: word(SEGS_OUT_AT)?,
        segs_in: word(SEGS_IN_AT)?,
    })
}

fn cookie_of(r: &InetResponse) -> u64 {
    u64::from_ne_bytes(r.header.socket_id.cookie)
}

/// Calls `each` for every inet response in a buffer of netlink messages; returns whether the
/// buffer ended a dump (`NLMSG_DONE`). A message that does not parse ends the buffer.
fn for_each_response(mut buf: &[u8], mut each: impl FnMut(&InetResponse)) -> io::Result<bool> {
    while !buf.is_empty() {
        let msg = <NetlinkMessage<SockDiagMessage>>::deserialize(buf)
            .map_err(|e| io::Error::other(format!("sock_diag: {e}")))?;
        let len = msg.header.length as usize;
        match msg.payload {
            NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(r)) => each(&r),
            NetlinkPayload::Done(_) => return Ok(true),
            NetlinkPayload::Error(e) => {
                return Err(io::Error::other(format!("sock_diag: {e:?}")));
            }
            _ => {}
        }
        if len == 0 || len > buf.len() {
            break;
        }
        // Messages are aligned to 4 bytes.
        buf = buf.get(len.next_multiple_of(4)..).unwrap_or(&[]);
    }
    Ok(false)
}

/// Every IPv4 TCP socket of this network namespace with its counters (a sock_diag dump).
pub fn dump() -> io::Result<Sockets> {
    let mut socket = Socket::new(NETLINK_SOCK_DIAG)?;
    socket.bind_auto()?;
    socket.connect(&SocketAddr::new(0, 0))?;
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    let mut request = NetlinkMessage::new(
        header,
        SockDiagMessage::InetRequest(InetRequest {
            family: AF_INET,
            protocol: IPPROTO_TCP,
            extensions: ExtensionFlags::INFO,
            states: StateFlags::all(),
            socket_id: SocketId::new_v4(),
        })
        .into(),
    );
    request.finalize();
    let mut out = vec![0; request.buffer_len()];
    request.serialize(&mut out);
    socket.send(&out, 0)?;
    let mut sockets = Sockets::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = socket.recv(&mut &mut buf[..], 0)?;
        if n == 0 {
            return Ok(sockets);
        }
        let done = for_each_response(&buf[..n], |r| {
            if let Some(s) = segments_of(r) {
                sockets.insert(cookie_of(r), s);
            }
        })?;
        if done {
            return Ok(sockets);
        }
    }
}

/// Listens to destroyed TCP sockets for the whole run; measures phases with [`begin`] and
/// [`end`].
///
/// [`begin`]: TcpMonitor::begin
/// [`end`]: TcpMonitor::end
pub struct TcpMonitor {
    destroyed: Arc<Mutex<Sockets>>,
    /// Receive errors (a full socket buffer drops events): a phase that saw one is not reported.
    lost: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// A phase's start: the dump and the loss count then.
pub struct Phase {
    start: Sockets,
    lost: u64,
}

impl TcpMonitor {
    /// Subscribes to destroyed sockets (needs `CAP_NET_ADMIN` in the namespace) and checks that
    /// a dump works.
    pub fn start() -> io::Result<TcpMonitor> {
        let mut socket = Socket::new(NETLINK_SOCK_DIAG)?;
        socket.bind_auto()?;
        socket.set_rx_buf_sz(8 << 20)?;
        socket.add_membership(GROUP_INET_TCP_DESTROY)?;
        socket.set_non_blocking(true)?;
        dump()?;
        let destroyed = Arc::new(Mutex::new(Sockets::new()));
        let lost = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (d, l, s) = (destroyed.clone(), lost.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("tcp-monitor".into())
            .spawn(move || listen(&socket, &d, &l, &s))?;
        Ok(TcpMonitor {
            destroyed,
            lost,
            stop,
            thread: Some(thread),
        })
    }

    /// Starts a phase: lets the events of what just closed arrive, forgets them, dumps.
    pub fn begin(&self) -> io::Result<Phase> {
        std::thread::sleep(SETTLE);
        self.destroyed.lock().clear();
        Ok(Phase {
            start: dump()?,
            lost: self.lost.load(Ordering::Relaxed),
        })
    }

    /// Ends a phase: each local address's segments since [`TcpMonitor::begin`]. An error when
    /// destroy events were lost in between (the figures would be short).
    pub fn end(&self, phase: Phase) -> io::Result<HashMap<IpAddr, Segments>> {
        std::thread::sleep(SETTLE);
        let live = dump()?;
        let destroyed = std::mem::take(&mut *self.destroyed.lock());
        let lost = self.lost.load(Ordering::Relaxed) - phase.lost;
        if lost > 0 {
            return Err(io::Error::other(format!(
                "{lost} receive errors on the destroyed-socket events: some were dropped"
            )));
        }
        Ok(per_address(&phase.start, &live, &destroyed))
    }
}

impl Drop for TcpMonitor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The listener thread: records every destroyed socket until told to stop.
fn listen(socket: &Socket, destroyed: &Mutex<Sockets>, lost: &AtomicU64, stop: &AtomicBool) {
    let mut buf = vec![0u8; 64 * 1024];
    while !stop.load(Ordering::Relaxed) {
        match socket.recv(&mut &mut buf[..], 0) {
            Ok(n) => {
                let mut batch = Vec::new();
                let parsed = for_each_response(&buf[..n], |r| {
                    if let Some(s) = segments_of(r) {
                        batch.push((cookie_of(r), s));
                    }
                });
                if parsed.is_err() {
                    lost.fetch_add(1, Ordering::Relaxed);
                }
                destroyed.lock().extend(batch);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => {
                // ENOBUFS: the kernel dropped events for a full receive buffer.
                lost.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(local: [u8; 4], out: u32, inn: u32) -> SocketSegments {
        SocketSegments {
            local: IpAddr::from(local),
            segs_out: out,
            segs_in: inn,
        }
    }

    #[test]
    fn a_phase_counts_what_each_socket_did_in_it() {
        let a = [127, 0, 0, 10];
        let b = [127, 0, 0, 11];
        // 1: alive throughout; 2: alive at the start, destroyed during; 3: born and destroyed
        // during; 4: born during, alive at the end; 5: destroyed before (only in the start).
        let start: Sockets = [(1, s(a, 10, 20)), (2, s(a, 5, 5)), (5, s(b, 7, 7))].into();
        let destroyed: Sockets = [(2, s(a, 9, 8)), (3, s(b, 4, 6))].into();
        let live: Sockets = [(1, s(a, 15, 21)), (4, s(b, 1, 2))].into();
        let got = per_address(&start, &live, &destroyed);
        assert_eq!(
            got[&IpAddr::from(a)],
            Segments {
                sent: 5 + 4,
                received: 1 + 3
            }
        );
        assert_eq!(
            got[&IpAddr::from(b)],
            Segments {
                sent: 4 + 1,
                received: 6 + 2
            }
        );
        assert_eq!(got.len(), 2);
    }

    #[test]
    fn counters_that_wrapped_still_count_forward() {
        let a = [127, 0, 0, 10];
        let start: Sockets = [(1, s(a, u32::MAX - 1, 0))].into();
        let live: Sockets = [(1, s(a, 3, 0))].into();
        let got = per_address(&start, &live, &Sockets::new());
        assert_eq!(got[&IpAddr::from(a)].sent, 5);
    }

    /// A real connection on loopback: its segments show up under each end's address, and the
    /// server's socket (closed during the phase) is counted through the destroy events.
    #[test]
    fn a_real_connection_is_counted_on_both_ends() {
        use std::io::{Read, Write};
        let Ok(monitor) = TcpMonitor::start() else {
            eprintln!("skipped: no CAP_NET_ADMIN for sock_diag destroy events here");
            return;
        };
        let server_ip = std::net::Ipv4Addr::new(127, 0, 0, 201);
        let client_ip = std::net::Ipv4Addr::new(127, 0, 0, 202);
        let listener = std::net::TcpListener::bind((server_ip, 0)).expect("bind");
        let addr = listener.local_addr().expect("addr");
        let phase = monitor.begin().expect("begin");
        let server = std::thread::spawn(move || {
            let (mut c, _) = listener.accept().expect("accept");
            let mut buf = [0u8; 5];
            c.read_exact(&mut buf).expect("read");
            c.write_all(b"world").expect("write");
            // Dropped: closed and destroyed during the phase.
        });
        let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .expect("socket");
        socket
            .bind(&std::net::SocketAddr::from((client_ip, 0)).into())
            .expect("bind client");
        socket.connect(&addr.into()).expect("connect");
        let mut client: std::net::TcpStream = socket.into();
        client.write_all(b"hello").expect("write");
        let mut buf = [0u8; 5];
        client.read_exact(&mut buf).expect("read");
        server.join().expect("server");
        let mut rest = Vec::new();
        let _ = client.read_to_end(&mut rest);
        let got = monitor.end(phase).expect("end");
        let server = got[&IpAddr::from(server_ip)];
        let client = got[&IpAddr::from(client_ip)];
        // SYN-ACK, data, ACKs and FIN at least; the exact count depends on delayed ACKs.
        assert!(server.sent >= 3 && server.received >= 3, "{server:?}");
        assert!(client.sent >= 3 && client.received >= 3, "{client:?}");
        // What one end sent the other received (no loss on loopback), give or take the
        // segments after the server's socket was destroyed (its last ACK in TIME_WAIT).
        assert!(
            client.received.abs_diff(server.sent) <= 1,
            "{client:?} {server:?}"
        );
        assert!(
            server.received.abs_diff(client.sent) <= 1,
            "{client:?} {server:?}"
        );
    }
}
