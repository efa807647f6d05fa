//! Tests of the link relays over real loopback sockets (ephemeral ports,
//! every wait bounded). Timing assertions are lower bounds implied by the
//! configured delay, bandwidth or loss, never upper bounds.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use meshcache_lab::link::{Bandwidth, Link, LinkConfig, LinkError, Profile, TcpRelay, UdpPair};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::time::timeout;

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

const LIMIT: Duration = Duration::from_secs(10);
const LOCALHOST: Ipv4Addr = Ipv4Addr::LOCALHOST;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A TCP relay on an ephemeral port in front of `target`.
async fn tcp_link(target: SocketAddr, link: LinkConfig, bind_out: Option<IpAddr>) -> Result<Link> {
    let listener = TcpListener::bind((LOCALHOST, 0)).await?;
    let relay = TcpRelay {
        target,
        bind_out,
        link,
        seed: 42,
    };
    Ok(Link::tcp(listener, relay, std::future::pending())?)
}

/// A server that answers every read with the same bytes, until end of
/// stream; reports each connection's peer address.
async fn echo_server() -> Result<(SocketAddr, tokio::sync::mpsc::UnboundedReceiver<SocketAddr>)> {
    let listener = TcpListener::bind((LOCALHOST, 0)).await?;
    let addr = listener.local_addr()?;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut s, peer)) = listener.accept().await {
            let _ = tx.send(peer);
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    Ok((addr, rx))
}

/// Sends `msg` and reads exactly as many bytes back.
async fn round_trip(s: &mut TcpStream, msg: &[u8]) -> Result<Vec<u8>> {
    timeout(LIMIT, s.write_all(msg)).await??;
    let mut back = vec![0u8; msg.len()];
    timeout(LIMIT, s.read_exact(&mut back)).await??;
    Ok(back)
}

/// Polls `cond` every 5 ms until it holds or the limit passes.
async fn eventually(mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + LIMIT;
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        tokio::time::sleep(ms(5)).await;
    }
    cond()
}

fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i % 251) as u8 ^ salt ^ (i >> 16) as u8)
        .collect()
}

#[tokio::test]
async fn tcp_delay_applies_to_handshake_and_each_round_trip() -> Result {
    let (target, mut peers) = echo_server().await?;
    let link = tcp_link(
        target,
        LinkConfig::symmetric(Profile::delay(ms(60))),
        Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2))),
    )
    .await?;

    let start = Instant::now();
    let mut s = timeout(LIMIT, TcpStream::connect(link.local_addr())).await??;
    assert_eq!(round_trip(&mut s, b"ping\n").await?, b"ping\n");
    let first = start.elapsed();
    // SYN, SYN-ACK, then the request and its answer: four one-way delays.
    assert!(first >= ms(240), "first exchange took {first:?}");

    let start = Instant::now();
    assert_eq!(round_trip(&mut s, b"again").await?, b"again");
    let second = start.elapsed();
    assert!(second >= ms(120), "second exchange took {second:?}");

    // The target saw the chosen source address.
    let peer = peers.try_recv()?;
    assert_eq!(peer.ip(), IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)));

    let c = link.counters();
    assert_eq!(c.connections, 1);
    assert_eq!(c.a_to_b.bytes, 10);
    assert_eq!(c.b_to_a.bytes, 10);
    drop(s);
    let c = link.stop().await;
    assert_eq!(c.active, 0);
    Ok(())
}

#[tokio::test]
async fn tcp_preserves_large_transfers_both_ways() -> Result {
    const LEN: usize = (3 << 20) + 17;
    let up = pattern(LEN, 0x5a);
    let down = pattern(LEN, 0xa5);

    // The target reads everything while sending its own stream.
    let listener = TcpListener::bind((LOCALHOST, 0)).await?;
    let target = listener.local_addr()?;
    let server_down = down.clone();
    let server = tokio::spawn(async move {
        let (s, _) = listener.accept().await?;
        let (mut r, mut w) = s.into_split();
        let writer = async move {
            w.write_all(&server_down).await?;
            w.shutdown().await
        };
        let reader = async move {
            let mut got = Vec::new();
            r.read_to_end(&mut got).await.map(|_| got)
        };
        let ((), got) = tokio::try_join!(writer, reader)?;
        Ok::<Vec<u8>, std::io::Error>(got)
    });

    let config = LinkConfig::symmetric(Profile {
        delay: ms(5),
        jitter: ms(3),
        ..Profile::default()
    });
    let link = tcp_link(target, config, None).await?;
    let s = timeout(LIMIT, TcpStream::connect(link.local_addr())).await??;
    let (mut r, mut w) = s.into_split();
    let up_copy = up.clone();
    let writer = async move {
        w.write_all(&up_copy).await?;
        w.shutdown().await
    };
    let reader = async move {
        let mut got = Vec::new();
        r.read_to_end(&mut got).await.map(|_| got)
    };
    let ((), client_got) = timeout(LIMIT, async { tokio::try_join!(writer, reader) }).await??;
    let server_got = timeout(LIMIT, server).await???;

    assert_eq!(client_got.len(), LEN);
    assert!(client_got == down, "B→A bytes differ");
    assert_eq!(server_got.len(), LEN);
    assert!(server_got == up, "A→B bytes differ");
    let c = link.counters();
    assert_eq!(c.a_to_b.bytes, LEN as u64);
    assert_eq!(c.b_to_a.bytes, LEN as u64);
    Ok(())
}

#[tokio::test]
async fn tcp_half_close_propagates_after_the_data() -> Result {
    let listener = TcpListener::bind((LOCALHOST, 0)).await?;
    let target = listener.local_addr()?;
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await?;
        // Reads to end of stream: only the client's shutdown can end this.
        let mut got = Vec::new();
        s.read_to_end(&mut got).await?;
        s.write_all(b"bye").await?;
        s.shutdown().await?;
        Ok::<Vec<u8>, std::io::Error>(got)
    });
    let link = tcp_link(target, LinkConfig::symmetric(Profile::delay(ms(20))), None).await?;
    let mut s = timeout(LIMIT, TcpStream::connect(link.local_addr())).await??;
    s.write_all(b"hello").await?;
    s.shutdown().await?;
    let mut back = Vec::new();
    timeout(LIMIT, s.read_to_end(&mut back)).await??;
    assert_eq!(back, b"bye");
    assert_eq!(timeout(LIMIT, server).await???, b"hello");
    Ok(())
}

#[tokio::test]
async fn tcp_bandwidth_is_a_lower_bound_on_time() -> Result {
    const LEN: usize = 400_000;
    let listener = TcpListener::bind((LOCALHOST, 0)).await?;
    let target = listener.local_addr()?;
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await?;
        let mut got = Vec::new();
        s.read_to_end(&mut got).await?;
        Ok::<usize, std::io::Error>(got.len())
    });
    // 8 Mbit/s is 1 MB/s: 400 kB take 0.4 s on the wire.
    let config = LinkConfig::symmetric(Profile {
        bandwidth: Bandwidth::from_bits_per_sec(8_000_000),
        ..Profile::default()
    });
    let link = tcp_link(target, config, None).await?;
    let start = Instant::now();
    let mut s = timeout(LIMIT, TcpStream::connect(link.local_addr())).await??;
    timeout(LIMIT, s.write_all(&pattern(LEN, 1))).await??;
    s.shutdown().await?;
    assert_eq!(timeout(LIMIT, server).await???, LEN);
    let took = start.elapsed();
    assert!(took >= ms(400), "400 kB at 1 MB/s took {took:?}");
    Ok(())
}

#[tokio::test]
async fn tcp_loss_costs_retransmission_timeouts() -> Result {
    let (target, _peers) = echo_server().await?;
    let config = LinkConfig::symmetric(Profile {
        loss: 0.3,
        ..Profile::default()
    });
    let link = tcp_link(target, config, None).await?;
    let mut s = timeout(LIMIT, TcpStream::connect(link.local_addr())).await??;
    let start = Instant::now();
    for i in 0..6u8 {
        assert_eq!(round_trip(&mut s, &[i; 3]).await?, [i; 3]);
    }
    let took = start.elapsed();
    let c = link.counters();
    let lost = c.a_to_b.lost + c.b_to_a.lost;
    // With this seed some of the 12 chunks are lost (a fixed outcome).
    assert!(lost >= 1, "no loss emulated: {c}");
    // Each lost chunk of a ping-pong costs at least one 200 ms RTO.
    assert!(
        took >= ms(200) * lost as u32,
        "{lost} losses but only {took:?}"
    );
    // Nothing is lost for real.
    assert_eq!(c.a_to_b.bytes, 18);
    assert_eq!(c.b_to_a.bytes, 18);
    Ok(())
}

#[tokio::test]
async fn tcp_connect_failure_and_stop() -> Result {
    // A target that refuses: a port bound then released.
    let closed = TcpListener::bind((LOCALHOST, 0)).await?.local_addr()?;
    let link = tcp_link(closed, LinkConfig::default(), None).await?;
    let addr = link.local_addr();
    let mut s = timeout(LIMIT, TcpStream::connect(addr)).await??;
    let mut buf = [0u8; 1];
    // The client's connection is closed without data.
    let n = timeout(LIMIT, s.read(&mut buf)).await?.unwrap_or(0);
    assert_eq!(n, 0);
    assert!(eventually(|| link.counters().connect_errors == 1).await);

    let counters = link.stop().await;
    assert_eq!(counters.connections, 1);
    // Stopped: the listener is gone.
    assert!(TcpStream::connect(addr).await.is_err());

    // An invalid profile is refused, naming the key.
    let listener = TcpListener::bind((LOCALHOST, 0)).await?;
    let mut link = LinkConfig::default();
    link.a_to_b.loss = Some(2.0);
    let relay = TcpRelay {
        target: closed,
        bind_out: None,
        link,
        seed: 1,
    };
    match Link::tcp(listener, relay, std::future::pending()) {
        Err(LinkError::Invalid { key, .. }) => assert_eq!(key, "a_to_b.loss"),
        other => panic!("expected an invalid-key error, got {other:?}"),
    }
    Ok(())
}

/// A UDP pair relay between two fresh sockets A and B.
struct UdpSetup {
    a: UdpSocket,
    b: UdpSocket,
    link: Link,
    a_side: SocketAddr,
    b_side: SocketAddr,
}

async fn udp_setup(link: LinkConfig, seed: u64) -> Result<UdpSetup> {
    let a = UdpSocket::bind((LOCALHOST, 0)).await?;
    let b = UdpSocket::bind((LOCALHOST, 0)).await?;
    let a_side = UdpSocket::bind((LOCALHOST, 0)).await?;
    let b_side = UdpSocket::bind((LOCALHOST, 0)).await?;
    let (a_side_addr, b_side_addr) = (a_side.local_addr()?, b_side.local_addr()?);
    let pair = UdpPair {
        a: a.local_addr()?,
        b: b.local_addr()?,
        link,
        seed,
    };
    let link = Link::udp_pair(a_side, b_side, pair, std::future::pending())?;
    Ok(UdpSetup {
        a,
        b,
        link,
        a_side: a_side_addr,
        b_side: b_side_addr,
    })
}

async fn recv(s: &UdpSocket) -> Result<(Vec<u8>, SocketAddr)> {
    let mut buf = vec![0u8; 2048];
    let (n, from) = timeout(LIMIT, s.recv_from(&mut buf)).await??;
    buf.truncate(n);
    Ok((buf, from))
}

#[tokio::test]
async fn udp_pair_forwards_both_ways_from_the_right_addresses() -> Result {
    let u = udp_setup(LinkConfig::symmetric(Profile::delay(ms(40))), 1).await?;

    let start = Instant::now();
    u.a.send_to(b"query", u.a_side).await?;
    let (got, from) = recv(&u.b).await?;
    assert!(start.elapsed() >= ms(40));
    assert_eq!(got, b"query");
    assert_eq!(from, u.b_side, "B must see the datagram come from b_side");

    let start = Instant::now();
    u.b.send_to(b"reply", u.b_side).await?;
    let (got, from) = recv(&u.a).await?;
    assert!(start.elapsed() >= ms(40));
    assert_eq!(got, b"reply");
    assert_eq!(from, u.a_side, "A must see the datagram come from a_side");

    // Strangers: a third socket, and A writing to B's face.
    let c = UdpSocket::bind((LOCALHOST, 0)).await?;
    c.send_to(b"stranger", u.a_side).await?;
    c.send_to(b"stranger", u.b_side).await?;
    u.a.send_to(b"wrong face", u.b_side).await?;
    let link = &u.link;
    assert!(eventually(|| link.counters().strangers == 3).await);
    // The next datagram B gets is A's next one (no jitter: in order).
    u.a.send_to(b"second", u.a_side).await?;
    assert_eq!(recv(&u.b).await?.0, b"second");
    let c = u.link.counters();
    assert_eq!(c.a_to_b.packets, 2);
    assert_eq!(c.a_to_b.bytes, 11);
    assert_eq!(c.b_to_a.packets, 1);
    Ok(())
}

#[tokio::test]
async fn udp_pair_drops_about_the_loss_share() -> Result {
    let config = LinkConfig::symmetric(Profile {
        loss: 0.2,
        ..Profile::default()
    });
    let u = udp_setup(config, 7).await?;
    // B drains its socket so that nothing piles up there.
    let b = u.b;
    let drain = tokio::spawn(async move {
        let mut buf = [0u8; 64];
        let mut n = 0u64;
        while let Ok(Ok(_)) = timeout(ms(500), b.recv_from(&mut buf)).await {
            n += 1;
        }
        n
    });
    // In batches, waiting for the relay to take each, so that no socket
    // buffer overflows.
    for batch in 1..=10u64 {
        for i in 0..100u64 {
            u.a.send_to(&(batch * 100 + i).to_be_bytes(), u.a_side)
                .await?;
        }
        let link = &u.link;
        assert!(
            eventually(|| {
                let c = link.counters().a_to_b;
                c.packets + c.lost == batch * 100
            })
            .await,
            "relay did not take batch {batch}: {}",
            link.counters()
        );
    }
    let c = u.link.counters();
    assert!(
        (120..=280).contains(&c.a_to_b.lost),
        "dropped {} of 1000 at loss 0.2",
        c.a_to_b.lost
    );
    let received = timeout(LIMIT, drain).await??;
    assert_eq!(received, c.a_to_b.packets);
    Ok(())
}
