//! Socket options per side, applied and read back.
//!
//! `http.socket` is for client connections, `upstream.socket` for the connections the proxy
//! opens (origins, peers, CONNECT tunnels). The buffer sizes are set before `listen` or
//! `connect`, so that the window scale negotiated in the handshake fits them (an accepted socket
//! inherits the listener's buffers); `TCP_NODELAY` is set on each connected socket.
//!
//! Then each connection's effective options are read back with `getsockopt` and the side's
//! latest are kept in [`SocketsSeen`] (`/stats` → `sockets`): what the kernel made of the config,
//! not what the config says. Linux reports twice the size asked for (room for its bookkeeping)
//! and caps it at `net.core.wmem_max` / `rmem_max`; a cap is logged once per side.

use std::io;

use parking_lot::Mutex;
use serde::Serialize;
use tokio::net::{TcpSocket, TcpStream};

use crate::config::SocketOptions;

/// How much more than asked the kernel reports for a buffer size it granted in full.
const REPORTED_FACTOR: u64 = if cfg!(target_os = "linux") { 2 } else { 1 };

/// Which side of the proxy a connection is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// Accepted from a client (`http.socket`).
    Client,
    /// Opened to an origin, a peer or a CONNECT target (`upstream.socket`).
    Upstream,
}

impl Side {
    /// The config section of the side's options.
    pub fn section(self) -> &'static str {
        match self {
            Side::Client => "http.socket",
            Side::Upstream => "upstream.socket",
        }
    }
}

/// A connection's options as `getsockopt` reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Effective {
    /// SO_SNDBUF, bytes (on Linux twice what was asked for).
    pub send_buffer: u64,
    /// SO_RCVBUF, bytes (on Linux twice what was asked for).
    pub recv_buffer: u64,
    /// TCP_NODELAY.
    pub nodelay: bool,
}

impl Effective {
    /// Reads the options of `stream` back from the kernel.
    pub fn of(stream: &TcpStream) -> io::Result<Effective> {
        let sock = socket2::SockRef::from(stream);
        Ok(Effective {
            send_buffer: sock.send_buffer_size()? as u64,
            recv_buffer: sock.recv_buffer_size()? as u64,
            nodelay: stream.nodelay()?,
        })
    }
}

/// One side's figures in `/stats`.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct SideReport {
    /// Connections whose options were read back.
    pub connections: u64,
    /// The latest of them, `null` before the first.
    pub last: Option<Effective>,
}

/// Both sides' figures in `/stats`.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct SocketsReport {
    /// Client connections.
    pub client: SideReport,
    /// Upstream connections.
    pub upstream: SideReport,
}

#[derive(Default)]
struct SideSeen {
    report: SideReport,
    /// A cap was logged already.
    warned: bool,
}

/// The effective options seen last on each side.
#[derive(Default)]
pub struct SocketsSeen {
    client: Mutex<SideSeen>,
    upstream: Mutex<SideSeen>,
}

impl SocketsSeen {
    /// Records a connection's effective options; logs (once per side) a buffer the kernel
    /// granted less of than `asked`.
    pub fn record(&self, side: Side, asked: &SocketOptions, got: Effective) {
        let capped: Vec<(&str, u64, u64, &str)> = [
            (
                "send_buffer",
                asked.send_buffer,
                got.send_buffer,
                "wmem_max",
            ),
            (
                "recv_buffer",
                asked.recv_buffer,
                got.recv_buffer,
                "rmem_max",
            ),
        ]
        .into_iter()
        .filter_map(|(name, want, have, sysctl)| {
            let want = want.filter(|&w| have < w.saturating_mul(REPORTED_FACTOR))?;
            Some((name, want, have, sysctl))
        })
        .collect();
        let first_cap = {
            let mut seen = match side {
                Side::Client => self.client.lock(),
                Side::Upstream => self.upstream.lock(),
            };
            seen.report.connections += 1;
            seen.report.last = Some(got);
            !capped.is_empty() && !std::mem::replace(&mut seen.warned, true)
        };
        if first_cap {
            for (name, want, have, sysctl) in capped {
                tracing::warn!(
                    "{}.{name} = {want} but the kernel granted {have} (as getsockopt reports \
                     it); raise net.core.{sysctl} to get the whole size",
                    side.section()
                );
            }
        }
    }

    /// Both sides' figures.
    pub fn report(&self) -> SocketsReport {
        SocketsReport {
            client: self.client.lock().report,
            upstream: self.upstream.lock().report,
        }
    }
}

/// Sets the buffer sizes of a socket before `connect` or `listen`.
pub fn set_buffers(socket: &TcpSocket, opts: &SocketOptions) -> io::Result<()> {
    if let Some(n) = opts.send_buffer {
        socket.set_send_buffer_size(u32::try_from(n).unwrap_or(u32::MAX))?;
    }
    if let Some(n) = opts.recv_buffer {
        socket.set_recv_buffer_size(u32::try_from(n).unwrap_or(u32::MAX))?;
    }
    Ok(())
}

/// Sets `TCP_NODELAY` on a connected socket and records what it ended up with. Failures are
/// logged, never fatal: the connection works either way.
pub fn connected(stream: &TcpStream, opts: &SocketOptions, side: Side, seen: &SocketsSeen) {
    if let Err(e) = stream.set_nodelay(opts.nodelay) {
        tracing::debug!(error = %e, side = side.section(), "cannot set TCP_NODELAY");
    }
    match Effective::of(stream) {
        Ok(got) => seen.record(side, opts, got),
        Err(e) => tracing::debug!(error = %e, side = side.section(), "cannot read socket options"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(send: Option<u64>, recv: Option<u64>) -> SocketOptions {
        SocketOptions {
            nodelay: true,
            send_buffer: send,
            recv_buffer: recv,
        }
    }

    #[test]
    fn records_the_latest_per_side() {
        let seen = SocketsSeen::default();
        let got = |n| Effective {
            send_buffer: n,
            recv_buffer: n,
            nodelay: true,
        };
        seen.record(Side::Client, &opts(None, None), got(1));
        seen.record(Side::Client, &opts(None, None), got(2));
        let r = seen.report();
        assert_eq!((r.client.connections, r.client.last), (2, Some(got(2))));
        assert_eq!((r.upstream.connections, r.upstream.last), (0, None));
    }

    #[test]
    fn a_cap_is_noticed_once() {
        let seen = SocketsSeen::default();
        let asked = opts(Some(4 << 20), None);
        let capped = Effective {
            send_buffer: 425_984,
            recv_buffer: 131_072,
            nodelay: true,
        };
        seen.record(Side::Upstream, &asked, capped);
        assert!(seen.upstream.lock().warned);
        let granted = Effective {
            send_buffer: (4 << 20) * REPORTED_FACTOR,
            ..capped
        };
        let other = SocketsSeen::default();
        other.record(Side::Upstream, &asked, granted);
        assert!(!other.upstream.lock().warned);
    }

    #[tokio::test]
    async fn options_are_read_back_from_the_socket() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let socket = TcpSocket::new_v4().expect("socket");
        let asked = opts(Some(48 * 1024), Some(56 * 1024));
        set_buffers(&socket, &asked).expect("buffers");
        let stream = socket.connect(addr).await.expect("connect");
        let seen = SocketsSeen::default();
        connected(&stream, &asked, Side::Upstream, &seen);
        let got = seen.report().upstream.last.expect("recorded");
        assert_eq!(got.send_buffer, 48 * 1024 * REPORTED_FACTOR);
        assert_eq!(got.recv_buffer, 56 * 1024 * REPORTED_FACTOR);
        assert!(got.nodelay);
    }
}
