//! The control protocol: one JSON request and one JSON reply per line over a Unix socket.
//!
//! Request: `{"v": 1, "op": "pipe_create", "name": "web", "ip": "10.0.0.2/24", "mtu": 1500}`.
//! Reply: `{"v": 1, "ok": true, "result": {...}}` or
//! `{"v": 1, "ok": false, "error": {"code": "ip_in_use", "message": "..."}}`.
//! Unknown fields, unknown operations, a wrong version or a line over [`MAX_LINE`] bytes get an
//! error reply and change nothing.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

mod client;
pub use client::{Client, ClientError, BUSY_PATIENCE};

/// Protocol version spoken by this build.
pub const PROTOCOL_VERSION: u32 = 1;
/// Longest request line accepted, in bytes.
pub const MAX_LINE: usize = 64 * 1024;
/// Default control socket.
pub const DEFAULT_SOCKET: &str = "/run/docknet/docknetd.sock";

/// A control request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Daemon identity, version and configuration. (Empty struct variants, not unit variants:
    /// serde only refuses unknown fields on struct variants of an internally tagged enum.)
    Status {},
    /// Create a pipe.
    PipeCreate {
        /// Name: 1–128 of `[A-Za-z0-9_.-]`, not starting with `.` or `-`.
        name: String,
        /// Address with prefix, `A.B.C.D/LEN`.
        ip: String,
        /// IPv6 address with prefix, `X::Y/LEN` (a dual-stack pipe).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ip6: Option<String>,
        /// MTU, 68–65535 (default 1500).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mtu: Option<u32>,
        /// Ring depth, a power of two (default by MTU).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ring_depth: Option<u32>,
        /// Labels recorded with the pipe and reported with it (at most 16; keys 1-128 of
        /// `[A-Za-z0-9_./-]`, values up to 1024 printable ASCII characters). The CNI plugin marks
        /// the pipes it owns with them.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        labels: BTreeMap<String, String>,
    },
    /// Delete a pipe and its fast channels.
    PipeRm {
        /// Pipe name.
        name: String,
    },
    /// List pipes.
    PipeLs {},
    /// One pipe with its counters.
    PipeShow {
        /// Pipe name.
        name: String,
    },
    /// Build a fast channel between two pipes.
    FcConnect {
        /// One partner.
        a: String,
        /// The other partner.
        b: String,
        /// MTU of the channel (default: the smaller of the two pipes' MTUs; TCP segments of up
        /// to 64 KiB pass whatever the MTU).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mtu: Option<u32>,
    },
    /// Remove a fast channel.
    FcRm {
        /// One partner.
        a: String,
        /// The other partner.
        b: String,
    },
    /// Hand a pipe to the container whose network namespace is `netns`: the daemon binds an
    /// abstract Unix socket there, and a container process that connects to it gets the pipe
    /// (and its fast channels) as file descriptors.
    PipeAttach {
        /// Pipe name.
        name: String,
        /// Path of the container's network namespace (`/proc/PID/ns/net`,
        /// `/var/run/netns/NAME`).
        netns: String,
        /// Abstract socket name, without `@` (default `docknet/pipe`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        socket: Option<String>,
    },
    /// Set a pipe's rate limits (each direction given; the others kept).
    RateSet {
        /// Pipe name.
        name: String,
        /// What the container sends, bits/s.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        egress_bps: Option<u64>,
        /// What is delivered to the container, bits/s.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ingress_bps: Option<u64>,
        /// Egress burst, bits (default: one coarse interval at the rate).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        egress_burst_bits: Option<u64>,
        /// Ingress burst, bits.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ingress_burst_bits: Option<u64>,
    },
    /// Remove a pipe's rate limits.
    RateClear {
        /// Pipe name.
        name: String,
    },
    /// A pipe's rate limits and its limiters' state.
    RateShow {
        /// Pipe name.
        name: String,
    },
    /// Close a pipe's socket in its container.
    PipeDetach {
        /// Pipe name.
        name: String,
    },
    /// Reach network `net` (`A.B.C.D/LEN`) through next hop `via` on the link.
    RouteAdd {
        /// The network, no host bits set (`0.0.0.0/0`: the default route).
        net: String,
        /// The next hop: an address on the link, reached by ARP; with `vxlan`, the tunnel's far
        /// end (another node's address).
        via: String,
        /// Through a VXLAN tunnel with this network identifier (0-16777215).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        vxlan: Option<u32>,
    },
    /// Remove the route to network `net`.
    RouteRm {
        /// The network, as added.
        net: String,
    },
    /// List the routes.
    RouteLs {},
    /// Set (add or replace) a service: a virtual address and port balanced over backends.
    ServiceSet {
        /// Its name (as a pipe's: 1-128 of `[A-Za-z0-9_.-]`).
        name: String,
        /// `VIP:PORT`.
        address: String,
        /// `tcp` (default) or `udp`.
        #[serde(default)]
        proto: ServiceProto,
        /// The ready backends, each `IP:PORT` (none: connects are refused).
        #[serde(default)]
        backends: Vec<String>,
        /// `none` (default) or `client-ip`.
        #[serde(default)]
        affinity: ServiceAffinity,
    },
    /// Remove a service.
    ServiceRm {
        /// Its name.
        name: String,
    },
    /// List the services.
    ServiceLs {},
    /// Every pipe with its counters, and the master threads' load (`docknet top`).
    Stats {},
    /// Mirror a pipe's frames to this connection: after the reply line, capture records
    /// follow (see [`crate::capture`]) until `count` frames were sent, the pipe goes away, or
    /// the client closes the connection.
    Capture {
        /// Pipe name.
        name: String,
        /// Bytes kept of each frame (64..=65535; default 65535).
        #[serde(default)]
        snaplen: Option<u32>,
        /// Frames to capture (default: until the client closes).
        #[serde(default)]
        count: Option<u64>,
    },
}

impl Request {
    /// The operation's name, as on the wire.
    pub fn op(&self) -> &'static str {
        match self {
            Request::Status {} => "status",
            Request::PipeCreate { .. } => "pipe_create",
            Request::PipeRm { .. } => "pipe_rm",
            Request::PipeLs {} => "pipe_ls",
            Request::PipeShow { .. } => "pipe_show",
            Request::FcConnect { .. } => "fc_connect",
            Request::FcRm { .. } => "fc_rm",
            Request::PipeAttach { .. } => "pipe_attach",
            Request::RateSet { .. } => "rate_set",
            Request::RateClear { .. } => "rate_clear",
            Request::RateShow { .. } => "rate_show",
            Request::PipeDetach { .. } => "pipe_detach",
            Request::RouteAdd { .. } => "route_add",
            Request::RouteRm { .. } => "route_rm",
            Request::RouteLs {} => "route_ls",
            Request::ServiceSet { .. } => "service_set",
            Request::ServiceRm { .. } => "service_rm",
            Request::ServiceLs {} => "service_ls",
            Request::Capture { .. } => "capture",
            Request::Stats {} => "stats",
        }
    }
}

/// Machine-readable error codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The line is not a valid request.
    BadRequest,
    /// The request's protocol version is not spoken here.
    UnsupportedVersion,
    /// No such pipe or channel.
    NotFound,
    /// Name or channel already exists.
    Exists,
    /// Invalid pipe name.
    BadName,
    /// Invalid address.
    BadIp,
    /// Address already used by another pipe.
    IpInUse,
    /// Invalid MTU or ring parameters.
    BadParams,
    /// The daemon failed (I/O); nothing was changed.
    Internal,
    /// Too many connections or requests at once; try again later.
    Busy,
}

impl ErrorCode {
    /// The code's name, as on the wire.
    pub fn name(self) -> String {
        serde_json::to_value(self)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default()
    }
}

/// An error reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    /// Code.
    pub code: ErrorCode,
    /// One human line.
    pub message: String,
}

impl ApiError {
    /// Builds an error.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            message: message.into(),
        }
    }
}

/// A reply line.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Reply {
    /// Protocol version.
    pub v: u32,
    /// Success?
    pub ok: bool,
    /// Result on success.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
    /// Error on failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ApiError>,
}

impl Reply {
    /// Turns a handler result into a reply.
    pub fn from_result(r: Result<serde_json::Value, ApiError>) -> Reply {
        match r {
            Ok(v) => Reply {
                v: PROTOCOL_VERSION,
                ok: true,
                result: Some(v),
                error: None,
            },
            Err(e) => Reply {
                v: PROTOCOL_VERSION,
                ok: false,
                result: None,
                error: Some(e),
            },
        }
    }
}

/// Parses one request line: checks the version, then the operation and its fields.
pub fn parse_request(line: &str) -> Result<Request, ApiError> {
    let mut v: serde_json::Value = serde_json::from_str(line)
        .map_err(|e| ApiError::new(ErrorCode::BadRequest, format!("not JSON: {e}")))?;
    let obj = v
        .as_object_mut()
        .ok_or_else(|| ApiError::new(ErrorCode::BadRequest, "request must be a JSON object"))?;
    match obj.remove("v").map(|x| x.as_u64()) {
        Some(Some(n)) if n == u64::from(PROTOCOL_VERSION) => {}
        Some(Some(n)) => {
            return Err(ApiError::new(
                ErrorCode::UnsupportedVersion,
                format!(
                    "protocol version {n} not supported; this daemon speaks {PROTOCOL_VERSION}"
                ),
            ))
        }
        _ => {
            return Err(ApiError::new(
                ErrorCode::BadRequest,
                "missing or non-numeric protocol version \"v\"",
            ))
        }
    }
    serde_json::from_value(v).map_err(|e| ApiError::new(ErrorCode::BadRequest, e.to_string()))
}

/// Serialises a request with the version field.
pub fn encode_request(r: &Request) -> String {
    let mut v = serde_json::to_value(r).unwrap_or_default();
    if let Some(o) = v.as_object_mut() {
        o.insert("v".into(), PROTOCOL_VERSION.into());
    }
    v.to_string()
}

/// A pipe as the daemon reports it (`pipe create`, `pipe ls`, `pipe show`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PipeInfo {
    /// Name.
    pub name: String,
    /// Address with prefix, `A.B.C.D/LEN`.
    pub ip: String,
    /// IPv6 address with prefix, `X::Y/LEN`, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip6: Option<String>,
    /// MAC assigned by the daemon, `aa:bb:cc:dd:ee:ff`.
    pub mac: String,
    /// MTU.
    pub mtu: u32,
    /// Slots per ring.
    pub ring_depth: u32,
    /// Bytes per slot.
    pub frame_size: u32,
    /// Size of the shared region.
    pub region_bytes: usize,
    /// The abstract socket its container finds it at (`@docknet/pipe`), once attached.
    #[serde(default)]
    pub socket: Option<String>,
    /// Live connections of container processes to it.
    #[serde(default)]
    pub connections: usize,
    /// Names of the pipes it has fast channels with.
    pub fast_channels: Vec<String>,
    /// Labels its creator recorded with it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Counters by name (`pipe show` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counters: Option<std::collections::BTreeMap<String, u64>>,
}

/// What one master thread did since the daemon started (`stats`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MasterLoad {
    /// Which master.
    pub master: usize,
    /// Pipes it owns.
    pub pipes: u64,
    /// Rounds over its pipes.
    pub rounds: u64,
    /// Frames it took.
    pub frames: u64,
    /// Nanoseconds in rounds that moved frames.
    pub busy_ns: u64,
    /// Nanoseconds awake without work.
    pub idle_ns: u64,
    /// Nanoseconds asleep.
    pub asleep_ns: u64,
    /// Times it went to sleep.
    pub sleeps: u64,
}

/// Every pipe with its counters and the masters' load (`stats`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// Daemon's monotonic clock when this was taken, ns (for rates between two of these).
    pub at_ns: u64,
    /// Pipes, with counters.
    pub pipes: Vec<PipeInfo>,
    /// One per master thread.
    pub masters: Vec<MasterLoad>,
    /// Frames delivered in total.
    pub forwarded: u64,
    /// Packet captures running.
    pub captures: usize,
    /// The pipes that have rate limits, with them.
    #[serde(default)]
    pub limits: Vec<RateInfo>,
}

/// The reply that starts a capture (records follow on the connection).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureStarted {
    /// Pipe name.
    pub pipe: String,
    /// Bytes kept of each frame.
    pub snaplen: u32,
    /// The pipe's fast-channel partners: their frames do not pass the daemon and are not in
    /// the capture.
    pub fast_channels: Vec<String>,
}

/// A fast channel as the daemon reports it (`fc connect`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FcInfo {
    /// One partner.
    pub a: String,
    /// The other.
    pub b: String,
    /// Channel MTU.
    pub mtu: u32,
    /// Slots per direction.
    pub ring_depth: u32,
    /// Size of the shared region.
    pub region_bytes: usize,
    /// Made by the daemon for pipes that talk, not by `fc connect`.
    #[serde(default)]
    pub auto: bool,
}

/// The daemon's identity, configuration and totals (`status`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    /// Protocol version spoken.
    pub protocol: u32,
    /// Daemon version.
    pub version: String,
    /// Its process id.
    pub pid: u32,
    /// Run directory.
    pub run_dir: String,
    /// Services handed to containers.
    #[serde(default)]
    pub services: usize,
    /// Control socket.
    pub socket: String,
    /// Idle policy of the master thread.
    pub idle: String,
    /// Core the master thread is pinned to.
    pub master_core: Option<usize>,
    /// Master threads.
    #[serde(default = "one")]
    pub masters: usize,
    /// Cores the master threads are pinned to (empty: not pinned).
    #[serde(default)]
    pub master_cores: Vec<usize>,
    /// Nice value of the master threads.
    #[serde(default)]
    pub master_nice: i32,
    /// Frames passed from one master thread to another.
    #[serde(default)]
    pub cross_master: u64,
    /// Frames dropped between master threads (an inbox full, or the pipe gone).
    #[serde(default)]
    pub cross_master_drops: u64,
    /// Live pipes.
    pub pipes: usize,
    /// Frames forwarded since start.
    pub forwarded: u64,
    /// Times the master thread went to sleep.
    pub master_sleeps: u64,
    /// Pipes cold now: idle long enough that watcher threads, not the master's rounds, wait
    /// for them (only with more pipes than the master sleeps on itself).
    #[serde(default)]
    pub cold_pipes: u64,
    /// Watcher threads running.
    #[serde(default)]
    pub watchers: u64,
    /// Spare regions the daemon keeps made ahead (`--spare-regions`; 0: none).
    #[serde(default)]
    pub spare_regions: usize,
    /// Spare regions ready now.
    #[serde(default)]
    pub spare_regions_ready: usize,
    /// Bytes of each spare region (a pipe's at the default MTU and ring depth).
    #[serde(default)]
    pub spare_region_bytes: usize,
    /// Whether the daemon joins pipes that talk by fast channels of its own (`auto`) or only
    /// builds those asked for (`manual`).
    #[serde(default)]
    pub fast_channels: String,
    /// Automatic fast channels now.
    #[serde(default)]
    pub auto_channels: usize,
    /// Automatic fast channels made since start.
    #[serde(default)]
    pub auto_channels_made: u64,
    /// Asks for an automatic channel not served (a rate limit, a capture, a pipe nobody
    /// reads, a pipe at its most channels).
    #[serde(default)]
    pub auto_channels_skipped: u64,
    /// Automatic channels removed because they went idle.
    #[serde(default)]
    pub auto_channels_reaped: u64,
    /// The link to the wire, when the daemon drives one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nic: Option<NicStatus>,
}

/// The daemon's link to the wire (`status`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NicStatus {
    /// Interface name.
    pub iface: String,
    /// `xdp` or `packet`.
    pub mode: String,
    /// Receive queues served.
    pub queues: u32,
    /// How the XDP program is attached (`native`, `generic`; `-` for packet).
    pub attach: String,
    /// `copy` or `zero-copy`.
    pub copy: String,
    /// The link's MAC (the pipes' next hop to the wire).
    pub mac: String,
    /// The link's MTU.
    pub mtu: u32,
    /// Longest frame the port moves.
    pub max_frame: usize,
    /// Segment offload: TCP segments longer than the MTU leave whole and coalesced ones arrive
    /// whole (AF_PACKET with virtio-net headers).
    #[serde(default)]
    pub offload: bool,
    /// Neighbours resolved on the wire.
    pub neighbours: u64,
    /// What the edge counted.
    pub counters: crate::nic::EdgeCounters,
    /// What the port counted.
    pub port: crate::nic::PortCounters,
}

/// A change of rate limits (`rate_set`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RateChange {
    /// Egress rate, bits/s.
    pub egress_bps: Option<u64>,
    /// Ingress rate, bits/s.
    pub ingress_bps: Option<u64>,
    /// Egress burst, bits.
    pub egress_burst_bits: Option<u64>,
    /// Ingress burst, bits.
    pub ingress_burst_bits: Option<u64>,
}

/// One direction of `rate show`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateDir {
    /// Rate, bits/s.
    pub rate_bps: u64,
    /// Bucket size, bits (after clamping).
    pub burst_bits: u64,
    /// Credit held when the master last published it, bits.
    pub tokens_bits: u64,
    /// Bytes let through.
    pub passed_bytes: u64,
    /// Times a frame waited for tokens.
    pub waits: u64,
    /// Ingress: bytes waiting in the daemon's queue in front of the pipe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queued_bytes: Option<u64>,
}

/// What `rate set`, `rate clear` and `rate show` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateInfo {
    /// The pipe.
    pub pipe: String,
    /// Egress rate, bits/s (`null`: unlimited).
    pub egress_bps: Option<u64>,
    /// Ingress rate, bits/s (`null`: unlimited).
    pub ingress_bps: Option<u64>,
    /// Egress limiter.
    pub egress: Option<RateDir>,
    /// Ingress limiter.
    pub ingress: Option<RateDir>,
    /// The fine timer, µs.
    pub fine_us: u64,
    /// The coarse timer, ms.
    pub coarse_ms: u64,
}

/// What `pipe attach` answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attached {
    /// The pipe.
    pub pipe: String,
    /// The abstract socket bound in its container, with `@`.
    pub socket: String,
}

/// A route, as `route add`, `route rm` and `route ls` answer it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteInfo {
    /// The network, `A.B.C.D/LEN`.
    pub net: String,
    /// The next hop on the link (a VXLAN route's: the tunnel's far end).
    pub via: String,
    /// The VXLAN network identifier of a tunnelled route.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vxlan: Option<u32>,
}

impl From<crate::route::Route> for RouteInfo {
    fn from(r: crate::route::Route) -> RouteInfo {
        RouteInfo {
            net: format!("{}/{}", r.net, r.prefix),
            via: r.via.to_string(),
            vxlan: r.vxlan,
        }
    }
}

/// A service's transport protocol.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ServiceProto {
    /// TCP.
    #[default]
    Tcp,
    /// UDP.
    Udp,
}

/// How a service spreads a client's connections.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ServiceAffinity {
    /// Each connection to any backend.
    #[default]
    None,
    /// Every connection of one client address to one backend (Kubernetes' `ClientIP`).
    ClientIp,
}

/// A service, as `service set` and `service ls` answer it (and as `state.json` records it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceInfo {
    /// Its name.
    pub name: String,
    /// `VIP:PORT`.
    pub address: String,
    /// `tcp` or `udp`.
    #[serde(default)]
    pub proto: ServiceProto,
    /// Its backends, `IP:PORT`.
    #[serde(default)]
    pub backends: Vec<String>,
    /// How connections spread.
    #[serde(default)]
    pub affinity: ServiceAffinity,
}

/// What `pipe rm`, `pipe detach` and `fc rm` answer: the name(s) removed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Removed {
    /// A pipe.
    Pipe {
        /// Its name.
        removed: String,
    },
    /// A fast channel.
    Channel {
        /// Its two partners.
        removed: [String; 2],
    },
}

fn one() -> usize {
    1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip() {
        let r = Request::PipeCreate {
            name: "a".into(),
            ip: "10.0.0.1/24".into(),
            ip6: None,
            mtu: Some(9000),
            ring_depth: None,
            labels: BTreeMap::from([("docknet.io/owner".into(), "cni".into())]),
        };
        assert_eq!(parse_request(&encode_request(&r)).unwrap(), r);
        // a pipe without IPv6 is asked for as before; with it, one more field
        assert!(!encode_request(&r).contains("ip6"));
        let dual = Request::PipeCreate {
            name: "d".into(),
            ip: "10.0.0.2/24".into(),
            ip6: Some("fd00::2/64".into()),
            mtu: None,
            ring_depth: None,
            labels: BTreeMap::new(),
        };
        assert_eq!(parse_request(&encode_request(&dual)).unwrap(), dual);
        assert_eq!(
            parse_request(r#"{"v":1,"op":"pipe_ls"}"#).unwrap(),
            Request::PipeLs {}
        );
    }

    #[test]
    fn refusals() {
        let code = |l: &str| parse_request(l).unwrap_err().code;
        assert_eq!(code("nonsense"), ErrorCode::BadRequest);
        assert_eq!(code("[1]"), ErrorCode::BadRequest);
        assert_eq!(code(r#"{"op":"pipe_ls"}"#), ErrorCode::BadRequest);
        assert_eq!(
            code(r#"{"v":2,"op":"pipe_ls"}"#),
            ErrorCode::UnsupportedVersion
        );
        assert_eq!(code(r#"{"v":1,"op":"explode"}"#), ErrorCode::BadRequest);
        assert_eq!(
            code(r#"{"v":1,"op":"pipe_rm","name":"a","force":true}"#),
            ErrorCode::BadRequest
        );
        assert_eq!(code(r#"{"v":1,"op":"pipe_rm"}"#), ErrorCode::BadRequest);
        assert_eq!(
            code(r#"{"v":1,"op":"pipe_create","name":"a","ip":"x","mtu":-1}"#),
            ErrorCode::BadRequest
        );
    }
}
