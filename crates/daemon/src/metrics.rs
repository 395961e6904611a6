//! Prometheus metrics: `docknet daemon --metrics 127.0.0.1:9109` serves `GET /metrics` in the
//! text format (OpenMetrics), encoded by the Prometheus project's Rust client.
//!
//! A scrape reads what already exists: the counter block the master threads publish for
//! every pipe, the masters' own statistics ([`crate::master::MasterStats`]), the link's
//! counters, the fast channels' producer indices and the control plane's request counts.
//! Nothing on the data path changes for it. The server takes one request per connection, at
//! most [`MAX_CLIENTS`] at once, each within [`DEADLINE`], and reads at most [`MAX_REQUEST`]
//! bytes of it.

use crate::control::Ctx;
use crate::registry::{Counter, COUNTER_NAMES};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Scrapers served at once; more are closed at once.
pub const MAX_CLIENTS: usize = 16;
/// A scraper must send its request and take the reply within this.
pub const DEADLINE: Duration = Duration::from_secs(10);
/// Longest request read.
pub const MAX_REQUEST: usize = 8192;
/// The content type of the reply.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Control-plane request counts by operation and error counts by code.
#[derive(Debug, Default)]
pub struct OpStats {
    requests: Mutex<BTreeMap<String, u64>>,
    errors: Mutex<BTreeMap<String, u64>>,
}

impl OpStats {
    /// Counts a request of operation `op` (`invalid` for a line that did not parse) and, if it
    /// failed, its error code.
    pub fn count(&self, op: &str, error: Option<&str>) {
        if let Ok(mut m) = self.requests.lock() {
            *m.entry(op.to_string()).or_default() += 1;
        }
        if let (Some(code), Ok(mut m)) = (error, self.errors.lock()) {
            *m.entry(code.to_string()).or_default() += 1;
        }
    }

    fn snapshot(&self) -> (BTreeMap<String, u64>, BTreeMap<String, u64>) {
        (
            self.requests.lock().map(|m| m.clone()).unwrap_or_default(),
            self.errors.lock().map(|m| m.clone()).unwrap_or_default(),
        )
    }
}

type Labels = Vec<(&'static str, String)>;

/// One family: its descriptor, then a sample per row (`make` turns a value into the metric).
fn family<V: Copy + Default, M: EncodeMetric>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: &[(Labels, V)],
    make: fn(V) -> M,
) -> fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, make(V::default()).metric_type())?;
    if let [(labels, v)] = rows {
        if labels.is_empty() {
            // no labels: `name value`, not `name{} value`
            return make(*v).encode(m);
        }
    }
    for (labels, v) in rows {
        make(*v).encode(m.encode_family(labels)?)?;
    }
    Ok(())
}

fn counter(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: &[(Labels, u64)],
) -> fmt::Result {
    family(enc, name, help, rows, ConstCounter::new)
}

fn gauge(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: &[(Labels, f64)],
) -> fmt::Result {
    family(enc, name, help, rows, ConstGauge::new)
}

fn counter_seconds(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: &[(Labels, f64)],
) -> fmt::Result {
    family(enc, name, help, rows, ConstCounter::new)
}

/// How a pipe counter is exported: its own family, or a reason of the drops family.
enum Export {
    Family(&'static str, &'static str),
    Drop(&'static str),
}

fn export_of(c: Counter) -> Export {
    use Counter as C;
    use Export::{Drop, Family};
    match c {
        C::TxPackets => Family(
            "docknet_pipe_tx_packets",
            "Frames the container sent (taken from its tx ring).",
        ),
        C::TxBytes => Family(
            "docknet_pipe_tx_bytes",
            "Bytes of the frames the container sent.",
        ),
        C::RxPackets => Family(
            "docknet_pipe_rx_packets",
            "Frames delivered to the container (into its rx ring).",
        ),
        C::RxBytes => Family(
            "docknet_pipe_rx_bytes",
            "Bytes of the frames delivered to the container.",
        ),
        C::DropRxFull => Drop("rx_full"),
        C::DropNoRoute => Drop("no_route"),
        C::DropSpoofed => Drop("spoofed"),
        C::DropMalformed => Drop("malformed"),
        C::DropUnsupported => Drop("unsupported"),
        C::DropTooBig => Drop("too_big"),
        C::BadDesc => Drop("bad_descriptor"),
        C::Oversize => Drop("oversize_descriptor"),
        C::RingOverrun => Drop("ring_overrun"),
        C::DropFloodLimited => Drop("flood_limited"),
        C::FloodRxFull => Drop("flood_rx_full"),
        C::RateLimited => Drop("rate_limited"),
        C::DropWire => Drop("wire"),
        C::DropExtHeader => Drop("ipv6_ext_header"),
        C::NdpReplies => Family(
            "docknet_pipe_ndp_replies",
            "IPv6 neighbour solicitations of the container the daemon answered.",
        ),
        C::ArpReplies => Family(
            "docknet_pipe_arp_replies",
            "ARP requests of the container the daemon answered.",
        ),
        C::Flooded => Family(
            "docknet_pipe_flooded",
            "Broadcast or multicast frames of the container copied to other pipes.",
        ),
        C::Kicks => Family(
            "docknet_pipe_kicks",
            "Futex wake-ups the daemon sent the container.",
        ),
        C::SpuriousWakes => Family(
            "docknet_pipe_spurious_wakes",
            "Times the container woke the daemon with no work.",
        ),
        C::RateWaits => Family(
            "docknet_pipe_rate_limit_waits",
            "Times a frame waited for the pipe's rate limit.",
        ),
        C::WireTx => Family(
            "docknet_pipe_wire_tx_packets",
            "Frames of the container sent to the wire.",
        ),
        C::WireRx => Family(
            "docknet_pipe_wire_rx_packets",
            "Frames from the wire delivered to the container.",
        ),
    }
}

/// The daemon's metrics, gathered on each scrape.
#[derive(Debug)]
pub struct Daemon {
    ctx: Arc<Ctx>,
    started: f64,
}

impl Daemon {
    /// Metrics of the daemon behind `ctx`.
    pub fn new(ctx: Arc<Ctx>) -> Daemon {
        Daemon {
            ctx,
            started: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
        }
    }
}

impl Collector for Daemon {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let ctx = &self.ctx;
        // what the registry knows, copied under its lock and encoded after
        let (pipes, fcs, limits, auto) = match ctx.registry.lock() {
            Ok(mut reg) => {
                let names: Vec<String> = reg.pipes().map(|p| p.name.clone()).collect();
                let pipes: Vec<_> = names
                    .iter()
                    .filter_map(|n| {
                        let p = reg.get(n).ok()?.clone();
                        let conns = reg.connections(n);
                        let fcs = reg.fc_peers(n).len();
                        Some((p, conns, fcs))
                    })
                    .collect();
                let limits: Vec<_> = names.iter().filter_map(|n| reg.rate_info(n).ok()).collect();
                (pipes, reg.fc_traffic(), limits, reg.auto_stats())
            }
            Err(_) => (Vec::new(), Vec::new(), Vec::new(), Default::default()),
        };
        let info = &ctx.info;
        gauge(
            &mut enc,
            "docknet_build_info",
            "The daemon's version and control protocol (always 1).",
            &[(
                vec![
                    ("version", info.version.clone()),
                    ("protocol", info.protocol.to_string()),
                    ("idle", info.idle.clone()),
                ],
                1.0,
            )],
        )?;
        gauge(
            &mut enc,
            "docknet_start_time_seconds",
            "When the daemon started, seconds since the Unix epoch.",
            &[(vec![], self.started)],
        )?;
        gauge(
            &mut enc,
            "docknet_pipes",
            "Pipes the daemon serves.",
            &[(vec![], pipes.len() as f64)],
        )?;

        // pipes
        let label = |p: &crate::registry::Pipe| vec![("pipe", p.name.clone())];
        gauge(
            &mut enc,
            "docknet_pipe_info",
            "A pipe's addresses, MAC and MTU (always 1).",
            &pipes
                .iter()
                .map(|(p, _, _)| {
                    let mut l = vec![
                        ("pipe", p.name.clone()),
                        ("ip", format!("{}/{}", p.ip, p.prefix)),
                        ("mac", crate::switch::fmt_mac(p.mac)),
                        ("mtu", p.mtu.to_string()),
                    ];
                    if let Some((a, len)) = p.ip6 {
                        l.push(("ip6", format!("{a}/{len}")));
                    }
                    (l, 1.0)
                })
                .collect::<Vec<_>>(),
        )?;
        gauge(
            &mut enc,
            "docknet_pipe_connections",
            "Container processes connected to the pipe.",
            &pipes
                .iter()
                .map(|(p, c, _)| (label(p), *c as f64))
                .collect::<Vec<_>>(),
        )?;
        gauge(
            &mut enc,
            "docknet_pipe_fast_channels",
            "Fast channels the pipe has.",
            &pipes
                .iter()
                .map(|(p, _, f)| (label(p), *f as f64))
                .collect::<Vec<_>>(),
        )?;
        let values: Vec<_> = pipes
            .iter()
            .map(|(p, _, _)| (p, p.counters.load_all()))
            .collect();
        let mut drops: Vec<(Labels, u64)> = Vec::new();
        for (k, _) in COUNTER_NAMES.iter().enumerate() {
            let Some(c) = Counter::from_index(k) else {
                continue;
            };
            match export_of(c) {
                Export::Family(name, help) => counter(
                    &mut enc,
                    name,
                    help,
                    &values
                        .iter()
                        .map(|(p, v)| (label(p), v[k]))
                        .collect::<Vec<_>>(),
                )?,
                Export::Drop(reason) => drops.extend(values.iter().map(|(p, v)| {
                    (
                        vec![("pipe", p.name.clone()), ("reason", reason.to_string())],
                        v[k],
                    )
                })),
            }
        }
        counter(
            &mut enc,
            "docknet_pipe_drops",
            "Frames of or for the pipe the daemon dropped, by reason (rx_full: its rx ring was full; no_route, spoofed, malformed, unsupported, too_big: refused by the switch; bad_descriptor, oversize_descriptor, ring_overrun: impossible ring contents from the container; flood_limited, flood_rx_full: broadcasts over budget or not taken; rate_limited: over its ingress limit's queue; wire: not sent to the wire; ipv6_ext_header: IPv6 extension headers the daemon does not pass).",
            &drops,
        )?;
        counter(
            &mut enc,
            "docknet_pipe_attach_refused",
            "Connections to the pipe's socket the daemon refused.",
            &pipes
                .iter()
                .map(|(p, _, _)| (label(p), p.attach_refused.load(Ordering::Relaxed)))
                .collect::<Vec<_>>(),
        )?;

        gauge(
            &mut enc,
            "docknet_pipe_rate_limit_bits_per_second",
            "A pipe's rate limit by direction (egress: what it sends; ingress: what is delivered to it); absent when unlimited.",
            &limits
                .iter()
                .flat_map(|r| {
                    [("egress", r.egress_bps), ("ingress", r.ingress_bps)]
                        .into_iter()
                        .filter_map(|(d, v)| {
                            v.map(|v| {
                                (
                                    vec![("pipe", r.pipe.clone()), ("direction", d.to_string())],
                                    v as f64,
                                )
                            })
                        })
                        .collect::<Vec<_>>()
                })
                .collect::<Vec<_>>(),
        )?;

        // fast channels
        let fc_label = |a: &str, b: &str| vec![("from", a.to_string()), ("to", b.to_string())];
        counter(
            &mut enc,
            "docknet_fast_channel_packets",
            "Frames a partner published on a fast channel, from its ring's producer index (modulo 2^32; written by the partner, so what it claims: the daemon does not see fast-channel frames).",
            &fcs.iter()
                .flat_map(|f| {
                    [
                        (fc_label(&f.a, &f.b), u64::from(f.a_to_b)),
                        (fc_label(&f.b, &f.a), u64::from(f.b_to_a)),
                    ]
                })
                .collect::<Vec<_>>(),
        )?;

        // masters
        let m = &ctx.master;
        let loads = m.loads();
        let secs = |ns: u64| ns as f64 / 1e9;
        let per = |f: fn(&crate::proto::MasterLoad) -> u64| {
            loads
                .iter()
                .map(|l| (vec![("master", l.master.to_string())], f(l)))
                .collect::<Vec<_>>()
        };
        let per_secs = |f: fn(&crate::proto::MasterLoad) -> u64| {
            per(f)
                .into_iter()
                .map(|(l, v)| (l, secs(v)))
                .collect::<Vec<_>>()
        };
        counter_seconds(
            &mut enc,
            "docknet_master_busy_seconds",
            "Time a master thread spent in rounds that moved frames.",
            &per_secs(|l| l.busy_ns),
        )?;
        counter_seconds(
            &mut enc,
            "docknet_master_idle_seconds",
            "Time a master thread was awake without work (empty rounds, spinning, yielding).",
            &per_secs(|l| l.idle_ns),
        )?;
        counter_seconds(
            &mut enc,
            "docknet_master_sleep_seconds",
            "Time a master thread slept on its futexes.",
            &per_secs(|l| l.asleep_ns),
        )?;
        counter(
            &mut enc,
            "docknet_master_rounds",
            "Rounds a master thread made over its pipes.",
            &per(|l| l.rounds),
        )?;
        counter(
            &mut enc,
            "docknet_master_sleeps",
            "Times a master thread went to sleep.",
            &per(|l| l.sleeps),
        )?;
        counter(
            &mut enc,
            "docknet_master_frames",
            "Frames a master thread took (from tx rings, other masters and the link).",
            &per(|l| l.frames),
        )?;
        gauge(
            &mut enc,
            "docknet_master_pipes",
            "Pipes a master thread owns.",
            &per(|l| l.pipes)
                .into_iter()
                .map(|(l, v)| (l, v as f64))
                .collect::<Vec<_>>(),
        )?;
        counter(
            &mut enc,
            "docknet_forwarded_packets",
            "Frames the masters delivered (into rx rings or to the wire).",
            &[(vec![], m.forwarded.load(Ordering::Relaxed))],
        )?;
        counter(
            &mut enc,
            "docknet_cross_master_packets",
            "Frames passed from one master thread to another.",
            &[(vec![], m.cross.load(Ordering::Relaxed))],
        )?;
        counter(
            &mut enc,
            "docknet_cross_master_drops",
            "Frames dropped between masters (inbox full or pipe gone).",
            &[(vec![], m.cross_drops.load(Ordering::Relaxed))],
        )?;
        gauge(
            &mut enc,
            "docknet_cold_pipes",
            "Idle pipes handed to watcher threads.",
            &[(vec![], m.cold.load(Ordering::Relaxed) as f64)],
        )?;

        // the link
        if let Some(e) = m.edge.get() {
            let l = vec![("link", e.link.name.clone())];
            let mut rows: Vec<(String, u64)> = Vec::new();
            for (prefix, v) in [
                ("edge", serde_json::to_value(e.counters.load())),
                (
                    "port",
                    serde_json::to_value(e.port_counters.lock().map(|p| *p).unwrap_or_default()),
                ),
            ] {
                if let Ok(serde_json::Value::Object(o)) = v {
                    for (k, v) in o {
                        if let Some(n) = v.as_u64() {
                            rows.push((format!("{prefix}_{k}"), n));
                        }
                    }
                }
            }
            counter(
                &mut enc,
                "docknet_nic_events",
                "What the daemon counted on the link it drives, by event (edge_*: the switch's side, port_*: the AF_XDP or AF_PACKET port's; docknet status --json explains each).",
                &rows
                    .into_iter()
                    .map(|(k, v)| {
                        let mut x = l.clone();
                        x.push(("event", k));
                        (x, v)
                    })
                    .collect::<Vec<_>>(),
            )?;
        }

        // the control plane
        let (reqs, errs) = ctx.ops.snapshot();
        counter(
            &mut enc,
            "docknet_control_requests",
            "Control-socket requests by operation (invalid: lines that did not parse).",
            &reqs
                .into_iter()
                .map(|(k, v)| (vec![("op", k)], v))
                .collect::<Vec<_>>(),
        )?;
        counter(
            &mut enc,
            "docknet_control_errors",
            "Control-socket requests that failed, by error code.",
            &errs
                .into_iter()
                .map(|(k, v)| (vec![("code", k)], v))
                .collect::<Vec<_>>(),
        )?;
        let caps = ctx.captures.lock().map(|c| c.len()).unwrap_or(0);
        gauge(
            &mut enc,
            "docknet_captures",
            "Packet captures running.",
            &[(vec![], caps as f64)],
        )?;
        let (now, made, skipped, reaped) = auto;
        gauge(
            &mut enc,
            "docknet_auto_channels",
            "Fast channels the daemon built for pipes that talk, now.",
            &[(vec![], now as f64)],
        )?;
        counter(
            &mut enc,
            "docknet_auto_channel_events",
            "Automatic fast channels made, asks not served, and channels removed as idle.",
            &[
                (vec![("event", "made".to_string())], made),
                (vec![("event", "skipped".to_string())], skipped),
                (vec![("event", "reaped".to_string())], reaped),
            ],
        )?;
        Ok(())
    }
}

/// The text exposition of `registry`.
pub fn render(registry: &Registry) -> String {
    let mut out = String::with_capacity(16 * 1024);
    if prometheus_client::encoding::text::encode(&mut out, registry).is_err() {
        out.clear();
    }
    out
}

/// Parses `--metrics`: `ADDR:PORT`, or a bare `PORT` for loopback.
pub fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    if let Ok(port) = s.parse::<u16>() {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    s.parse::<SocketAddr>()
        .map_err(|_| format!("{s:?}: give ADDR:PORT (e.g. 127.0.0.1:9109) or a port"))
}

async fn serve_one(registry: Arc<Registry>, mut s: TcpStream) {
    let mut buf = vec![0u8; MAX_REQUEST];
    let mut n = 0;
    // read until the header ends (or the buffer is full)
    let head = loop {
        let Ok(k) = s.read(&mut buf[n..]).await else {
            return;
        };
        if k == 0 {
            return;
        }
        n += k;
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&buf[..n]) {
            Ok(httparse::Status::Complete(_)) => {
                break Some((
                    req.method.unwrap_or("").to_string(),
                    req.path.unwrap_or("").to_string(),
                ))
            }
            Ok(httparse::Status::Partial) if n < buf.len() => continue,
            _ => break None,
        }
    };
    let (status, body, ctype) = match head {
        None => ("400 Bad Request", "bad request\n".to_string(), "text/plain"),
        Some((m, _)) if m != "GET" && m != "HEAD" => (
            "405 Method Not Allowed",
            "only GET\n".to_string(),
            "text/plain",
        ),
        Some((m, p)) if p == "/metrics" || p.starts_with("/metrics?") => {
            let r = registry.clone();
            let text = tokio::task::spawn_blocking(move || render(&r))
                .await
                .unwrap_or_default();
            (
                "200 OK",
                if m == "HEAD" { String::new() } else { text },
                CONTENT_TYPE,
            )
        }
        Some(_) => (
            "404 Not Found",
            "docknet daemon: metrics are at /metrics\n".to_string(),
            "text/plain",
        ),
    };
    let reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = s.write_all(reply.as_bytes()).await;
    let _ = s.shutdown().await;
}

/// Serves `GET /metrics` on `listener` until the task is dropped.
pub async fn serve(ctx: Arc<Ctx>, listener: TcpListener) {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Daemon::new(ctx)));
    let registry = Arc::new(registry);
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CLIENTS));
    loop {
        let Ok((s, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            drop(s);
            continue;
        };
        let r = registry.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(DEADLINE, serve_one(r, s)).await;
            drop(permit);
        });
    }
}
