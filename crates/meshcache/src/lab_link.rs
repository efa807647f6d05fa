//! `meshcache lab link`: runs emulated wide-area links in the foreground.
//!
//! Each `--tcp LISTEN=TARGET` starts a TCP relay and each
//! `--udp A_SIDE,B_SIDE,A_ADDR,B_ADDR` a UDP pair relay (see
//! `meshcache_lab::link` for what they do), all with the same profile:
//! `--delay`, `--jitter`, `--loss`, `--bandwidth` for a symmetric link, or
//! `--profile FILE` for a TOML profile with per-direction settings. The
//! relays run until SIGINT or SIGTERM, then each prints its counters.
//!
//! ```text
//! meshcache lab link --tcp 127.0.0.10:3128=127.0.0.3:3128 \
//!     --udp 127.0.0.10:3130,127.0.0.11:3130,127.0.0.2:3130,127.0.0.3:3130 \
//!     --delay 139ms --jitter 5ms --loss 0.001 --bandwidth "10 Mbit"
//! ```

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use meshcache_lab::link::{Bandwidth, Link, LinkConfig, Profile, TcpRelay, UdpPair};
use tokio::net::{TcpListener, UdpSocket};

/// Arguments of `meshcache lab link`.
#[derive(clap::Args)]
pub struct LinkArgs {
    /// A TCP relay: listen on LISTEN and relay each connection to TARGET
    /// (repeatable).
    #[arg(long = "tcp", value_name = "LISTEN=TARGET", value_parser = parse_tcp)]
    tcp: Vec<TcpSpec>,
    /// A UDP pair relay: A_SIDE is the address A sends to (for B), B_SIDE the
    /// address B sends to (for A), then A's and B's own addresses
    /// (repeatable).
    #[arg(long = "udp", value_name = "A_SIDE,B_SIDE,A_ADDR,B_ADDR", value_parser = parse_udp)]
    udp: Vec<UdpSpec>,
    /// One-way delay, each direction (e.g. 139ms).
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    delay: Duration,
    /// Jitter: each delay is drawn uniformly in delay ± jitter.
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    jitter: Duration,
    /// Share of segments (TCP: paid as retransmission timeouts) or datagrams
    /// (UDP: dropped) lost, 0 to 1.
    #[arg(long, default_value_t = 0.0)]
    loss: f64,
    /// Link rate in bits per second, e.g. "10 Mbit" (unlimited when absent).
    #[arg(long, value_parser = parse_bandwidth)]
    bandwidth: Option<Bandwidth>,
    /// A TOML link profile with per-direction settings (`a_to_b`, `b_to_a`),
    /// instead of --delay, --jitter, --loss and --bandwidth.
    #[arg(long, conflicts_with_all = ["delay", "jitter", "loss", "bandwidth"])]
    profile: Option<PathBuf>,
    /// Local IP the TCP relays connect from, so targets see this source
    /// address.
    #[arg(long)]
    bind_out: Option<IpAddr>,
    /// Seed of the jitter and loss draws (relay `i` uses seed + i).
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// `LISTEN=TARGET`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct TcpSpec {
    listen: SocketAddr,
    target: SocketAddr,
}

/// `A_SIDE,B_SIDE,A_ADDR,B_ADDR`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct UdpSpec {
    a_side: SocketAddr,
    b_side: SocketAddr,
    a: SocketAddr,
    b: SocketAddr,
}

fn addr(s: &str) -> Result<SocketAddr, String> {
    s.trim()
        .parse()
        .map_err(|_| format!("{s:?} is not an address like 127.0.0.2:3128"))
}

fn parse_tcp(s: &str) -> Result<TcpSpec, String> {
    let (listen, target) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected LISTEN=TARGET"))?;
    Ok(TcpSpec {
        listen: addr(listen)?,
        target: addr(target)?,
    })
}

fn parse_udp(s: &str) -> Result<UdpSpec, String> {
    let parts: Vec<&str> = s.split(',').collect();
    let [a_side, b_side, a, b] = parts[..] else {
        return Err(format!("{s:?}: expected A_SIDE,B_SIDE,A_ADDR,B_ADDR"));
    };
    Ok(UdpSpec {
        a_side: addr(a_side)?,
        b_side: addr(b_side)?,
        a: addr(a)?,
        b: addr(b)?,
    })
}

fn parse_bandwidth(s: &str) -> Result<Bandwidth, String> {
    s.parse()
        .map_err(|e: meshcache_lab::link::LinkError| e.to_string())
}

/// The profile the arguments describe, validated.
fn link_config(args: &LinkArgs) -> anyhow::Result<LinkConfig> {
    let config = match &args.profile {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            toml::from_str(&text)
                .with_context(|| format!("{} is not a valid link profile", path.display()))?
        }
        None => LinkConfig::symmetric(Profile {
            delay: args.delay,
            jitter: args.jitter,
            loss: args.loss,
            bandwidth: args.bandwidth,
        }),
    };
    config.directions()?;
    Ok(config)
}

/// Runs the command.
pub fn run(args: LinkArgs) -> anyhow::Result<()> {
    if args.tcp.is_empty() && args.udp.is_empty() {
        anyhow::bail!("nothing to relay: give at least one --tcp or --udp");
    }
    let link = link_config(&args)?;
    crate::init_tracing();
    crate::runtime()?.block_on(async {
        let mut links: Vec<Link> = Vec::new();
        let mut seed = args.seed;
        for spec in &args.tcp {
            let listener = TcpListener::bind(spec.listen)
                .await
                .with_context(|| format!("cannot listen on {}", spec.listen))?;
            let relay = TcpRelay {
                target: spec.target,
                bind_out: args.bind_out,
                link,
                seed,
            };
            links.push(Link::tcp(listener, relay, std::future::pending())?);
            seed = seed.wrapping_add(1);
        }
        for spec in &args.udp {
            let bind = |addr: SocketAddr| async move {
                UdpSocket::bind(addr)
                    .await
                    .with_context(|| format!("cannot bind {addr}"))
            };
            let pair = UdpPair {
                a: spec.a,
                b: spec.b,
                link,
                seed,
            };
            let (a_side, b_side) = (bind(spec.a_side).await?, bind(spec.b_side).await?);
            links.push(Link::udp_pair(
                a_side,
                b_side,
                pair,
                std::future::pending(),
            )?);
            seed = seed.wrapping_add(1);
        }
        let profile = toml::to_string(&link)
            .unwrap_or_default()
            .trim()
            .replace('\n', "; ");
        for l in &links {
            tracing::info!(link = %l.addrs(), %profile, "lab link running");
        }
        crate::shutdown_signal().await;
        for l in links {
            let addrs = l.addrs();
            let counters = l.stop().await;
            println!("{addrs}: {counters}");
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse() {
        assert_eq!(
            parse_tcp("127.0.0.2:3128=127.0.0.3:80"),
            Ok(TcpSpec {
                listen: "127.0.0.2:3128".parse().expect("addr"),
                target: "127.0.0.3:80".parse().expect("addr"),
            })
        );
        assert!(parse_tcp("127.0.0.2:3128").is_err());
        assert!(parse_tcp("127.0.0.2=127.0.0.3:80").is_err());
        let u = parse_udp("127.0.0.10:3130,127.0.0.11:3130,127.0.0.2:3130,127.0.0.3:3130");
        assert_eq!(
            u.map(|u| (u.a_side.port(), u.b.ip().to_string())),
            Ok((3130, "127.0.0.3".to_owned()))
        );
        assert!(parse_udp("127.0.0.10:3130,127.0.0.11:3130,127.0.0.2:3130").is_err());
        assert_eq!(
            parse_bandwidth("10 Mbit").map(|b| b.bits_per_sec()),
            Ok(10_000_000)
        );
        assert!(parse_bandwidth("10 MB").is_err());
    }
}
