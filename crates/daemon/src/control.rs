//! The control socket: a tokio task per connection, one JSON request and reply per line.
//!
//! Bounds: at most [`MAX_CONNECTIONS`] clients at once (one more gets a `busy` error and is
//! closed, so the accept loop, and with it SIGTERM, is never held up); a client waits at most
//! [`IDLE`] between requests, [`LINE`] to finish a request it started, and [`WRITE`] for its
//! reply to be taken. All state changes go through one mutex-guarded [`Registry`]; each change
//! publishes a new snapshot to the master thread.

use crate::capture::{Summary, Tap};
use crate::master::MasterShared;
use crate::proto::{
    parse_request, ApiError, Attached, ErrorCode, Removed, Reply, Request, Status, MAX_LINE,
};
use crate::registry::Registry;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Semaphore;

/// Most clients served at once.
pub const MAX_CONNECTIONS: usize = 64;
/// A client idle this long between requests is closed.
pub const IDLE: Duration = Duration::from_secs(60);
/// A request line must be complete this long after its first byte.
pub const LINE: Duration = Duration::from_secs(5);
/// A reply must be taken by the client within this long.
pub const WRITE: Duration = Duration::from_secs(5);

/// Everything a request handler needs.
#[derive(Debug)]
pub struct Ctx {
    /// Pipes and channels.
    pub registry: Mutex<Registry>,
    /// The master thread's shared state.
    pub master: Arc<MasterShared>,
    /// Static facts reported by `status` (its totals are filled in per request).
    pub info: Status,
    /// Wakes the accept thread when attachments change.
    pub attach: std::sync::OnceLock<crate::attach::Waker>,
    /// Requests and errors by kind, for the metrics.
    pub ops: crate::metrics::OpStats,
    /// Captures running.
    pub captures: Mutex<Vec<Arc<Tap>>>,
    /// The link to the node's kernel, when the daemon made one: its routes follow the pipes.
    pub host_link: Mutex<Option<crate::nic::host::HostLink>>,
    /// The guard of a `--nic` link driven through a packet socket: its set follows the pipes.
    pub link_guard: Mutex<Option<crate::nic::guard::Guard>>,
}

impl Ctx {
    /// Keeps the host's view of the pipes equal to the registry's: the host link's routes to
    /// them, the link guard's set of their addresses.
    pub fn follow_pipes(&self, reg: &Registry) {
        if let Ok(mut h) = self.host_link.lock() {
            if let Some(h) = h.as_mut() {
                h.route_pipes(reg.pipes().map(|p| p.ip));
            }
        }
        if let Ok(mut g) = self.link_guard.lock() {
            if let Some(g) = g.as_mut() {
                g.set_pipes(reg.pipes().map(|p| p.ip));
            }
        }
    }
}

fn to_json(v: impl serde::Serialize) -> Result<serde_json::Value, ApiError> {
    serde_json::to_value(v).map_err(|e| ApiError::new(ErrorCode::Internal, e.to_string()))
}

/// Handles one request.
pub fn handle(ctx: &Ctx, req: Request) -> Result<serde_json::Value, ApiError> {
    let mut reg = ctx
        .registry
        .lock()
        .map_err(|_| ApiError::new(ErrorCode::Internal, "registry lock poisoned"))?;
    let changed = matches!(
        req,
        Request::PipeCreate { .. }
            | Request::PipeRm { .. }
            | Request::FcConnect { .. }
            | Request::FcRm { .. }
            | Request::RateSet { .. }
            | Request::RateClear { .. }
            | Request::RouteAdd { .. }
            | Request::RouteRm { .. }
    );
    let out = match req {
        Request::Status {} => {
            let (spare_regions, spare_regions_ready, spare_region_bytes) = reg.spare_regions();
            let (auto_channels, auto_channels_made, auto_channels_skipped, auto_channels_reaped) =
                reg.auto_stats();
            to_json(Status {
                auto_channels,
                auto_channels_made,
                auto_channels_skipped,
                auto_channels_reaped,
                pipes: reg.pipes().count(),
                services: reg.service_count(),
                spare_regions,
                spare_regions_ready,
                spare_region_bytes,
                forwarded: ctx.master.forwarded.load(Ordering::Relaxed),
                master_sleeps: ctx.master.sleeps.load(Ordering::Relaxed),
                cold_pipes: ctx.master.cold.load(Ordering::Relaxed),
                cross_master: ctx.master.cross.load(Ordering::Relaxed),
                cross_master_drops: ctx.master.cross_drops.load(Ordering::Relaxed),
                watchers: ctx.master.watchers.load(Ordering::Relaxed),
                nic: ctx.master.edge.get().map(|e| crate::proto::NicStatus {
                    iface: e.link.name.clone(),
                    mode: e.port.mode.into(),
                    queues: e.port.queues,
                    attach: e.port.attach.clone(),
                    copy: e.port.copy.clone(),
                    mac: crate::switch::fmt_mac(e.link.mac),
                    mtu: e.link.mtu,
                    max_frame: e.port.max_frame,
                    offload: e.port.offload,
                    neighbours: e.neighbours.load(Ordering::Relaxed),
                    counters: e.counters.load(),
                    port: e.port_counters.lock().map(|p| *p).unwrap_or_default(),
                }),
                ..ctx.info.clone()
            })
        }
        Request::PipeCreate {
            name,
            ip,
            ip6,
            mtu,
            ring_depth,
            labels,
        } => {
            reg.create_pipe_dual(&name, &ip, ip6.as_deref(), mtu, ring_depth, labels)?;
            tracing::info!(pipe = %name, ip = %ip, ip6 = ?ip6, "pipe created");
            to_json(reg.pipe_info(&name, false)?)
        }
        Request::PipeRm { name } => {
            reg.remove_pipe(&name)?;
            tracing::info!(pipe = %name, "pipe removed");
            // the accept thread holds the pipe's listening socket until it looks again: until
            // then the name stays bound in the container's namespace (a CNI DEL followed by an
            // ADD in the same namespace found it taken)
            if let Some(w) = ctx.attach.get() {
                w.wake();
            }
            to_json(Removed::Pipe { removed: name })
        }
        Request::PipeLs {} => {
            let names: Vec<String> = reg.pipes().map(|p| p.name.clone()).collect();
            let list: Result<Vec<_>, _> = names.iter().map(|n| reg.pipe_info(n, false)).collect();
            to_json(list?)
        }
        Request::PipeShow { name } => to_json(reg.pipe_info(&name, true)?),
        Request::Stats {} => {
            let names: Vec<String> = reg.pipes().map(|p| p.name.clone()).collect();
            let pipes: Result<Vec<_>, _> = names.iter().map(|n| reg.pipe_info(n, true)).collect();
            let m = &ctx.master;
            to_json(crate::proto::Stats {
                at_ns: docknet_pipe::wake::monotonic_ns(),
                pipes: pipes?,
                masters: m.loads(),
                forwarded: m.forwarded.load(Ordering::Relaxed),
                captures: ctx.captures.lock().map(|c| c.len()).unwrap_or(0),
                limits: names
                    .iter()
                    .filter_map(|n| reg.rate_info(n).ok())
                    .filter(|r| r.egress_bps.is_some() || r.ingress_bps.is_some())
                    .collect(),
            })
        }
        Request::Capture { .. } => Err(ApiError::new(
            ErrorCode::BadRequest,
            "capture streams on its own connection (docknet capture)",
        )),
        Request::RateSet {
            name,
            egress_bps,
            ingress_bps,
            egress_burst_bits,
            ingress_burst_bits,
        } => {
            let r = reg.set_rate(
                &name,
                &crate::proto::RateChange {
                    egress_bps,
                    ingress_bps,
                    egress_burst_bits,
                    ingress_burst_bits,
                },
            )?;
            tracing::info!(pipe = %name, egress = ?egress_bps, ingress = ?ingress_bps, "rate limits set");
            to_json(r)
        }
        Request::RateClear { name } => {
            let r = reg.clear_rate(&name)?;
            tracing::info!(pipe = %name, "rate limits cleared");
            to_json(r)
        }
        Request::RateShow { name } => to_json(reg.rate_info(&name)?),
        Request::RouteAdd { net, via, vxlan } => {
            let r = reg.add_route(&net, &via, vxlan)?;
            tracing::info!(route = %r, "route added");
            to_json(crate::proto::RouteInfo::from(r))
        }
        Request::RouteRm { net } => {
            let r = reg.remove_route(&net)?;
            tracing::info!(route = %r, "route removed");
            to_json(crate::proto::RouteInfo::from(r))
        }
        Request::ServiceSet {
            name,
            address,
            proto,
            backends,
            affinity,
        } => {
            let s = reg.set_service(&crate::proto::ServiceInfo {
                name,
                address,
                proto,
                backends,
                affinity,
            })?;
            tracing::info!(service = %s.name, address = %s.address, backends = s.backends.len(), "service set");
            to_json(s)
        }
        Request::ServiceRm { name } => {
            let s = reg.remove_service(&name)?;
            tracing::info!(service = %s.name, "service removed");
            to_json(s)
        }
        Request::ServiceLs {} => to_json(reg.services()),
        Request::RouteLs {} => to_json(
            reg.routes()
                .into_iter()
                .map(crate::proto::RouteInfo::from)
                .collect::<Vec<_>>(),
        ),
        Request::FcConnect { a, b, mtu } => {
            let f = reg.connect_fc(&a, &b, mtu)?;
            tracing::info!(a = %a, b = %b, "fast channel connected");
            to_json(f)
        }
        Request::FcRm { a, b } => {
            reg.remove_fc(&a, &b)?;
            tracing::info!(a = %a, b = %b, "fast channel removed");
            to_json(Removed::Channel { removed: [a, b] })
        }
        Request::PipeAttach {
            name,
            netns,
            socket,
        } => {
            reg.attach(&name, &netns, socket.as_deref())?;
            let socket = socket.unwrap_or_else(|| docknet_pipe::delivery::DEFAULT_SOCKET.into());
            tracing::info!(pipe = %name, netns = %netns, socket = %socket, "pipe attached");
            if let Some(w) = ctx.attach.get() {
                w.wake();
            }
            to_json(Attached {
                pipe: name,
                socket: format!("@{socket}"),
            })
        }
        Request::PipeDetach { name } => {
            reg.detach(&name)?;
            tracing::info!(pipe = %name, "pipe detached");
            if let Some(w) = ctx.attach.get() {
                w.wake();
            }
            to_json(Removed::Pipe { removed: name })
        }
    };
    if changed && out.is_ok() {
        ctx.master.publish(reg.snapshot());
        ctx.follow_pipes(&reg);
    }
    out
}

fn reply_bytes(r: Result<serde_json::Value, ApiError>) -> Vec<u8> {
    let mut out = serde_json::to_vec(&Reply::from_result(r)).unwrap_or_else(|_| {
        format!("{{\"v\":{},\"ok\":false}}", crate::proto::PROTOCOL_VERSION).into_bytes()
    });
    out.push(b'\n');
    out
}

async fn serve_conn(ctx: Arc<Ctx>, stream: UnixStream) {
    let (rd, mut wr) = stream.into_split();
    let mut rd = BufReader::new(rd);
    loop {
        // wait for a request to start, then give it a deadline to finish
        match tokio::time::timeout(IDLE, rd.fill_buf()).await {
            Ok(Ok(b)) if !b.is_empty() => {}
            _ => return,
        }
        let mut line = Vec::new();
        let mut limited = (&mut rd).take(MAX_LINE as u64 + 1);
        match tokio::time::timeout(LINE, limited.read_until(b'\n', &mut line)).await {
            Ok(Ok(n)) if n > 0 => {}
            _ => return,
        }
        let too_long = line.len() > MAX_LINE;
        let reply = if too_long {
            Err(ApiError::new(
                ErrorCode::BadRequest,
                format!("request longer than {MAX_LINE} bytes"),
            ))
        } else {
            let text = String::from_utf8_lossy(&line);
            let text = text.trim();
            if text.is_empty() {
                continue;
            }
            match parse_request(text) {
                Ok(Request::Capture {
                    name,
                    snaplen,
                    count,
                }) => {
                    // the connection becomes the capture's stream, then ends
                    let r = capture(&ctx, &name, snaplen, count, rd, wr).await;
                    ctx.ops
                        .count("capture", r.err().map(|e| e.code.name()).as_deref());
                    return;
                }
                Ok(req) => {
                    let op = req.op();
                    let ctx2 = ctx.clone();
                    let r = tokio::task::spawn_blocking(move || handle(&ctx2, req))
                        .await
                        .unwrap_or_else(|e| Err(ApiError::new(ErrorCode::Internal, e.to_string())));
                    ctx.ops
                        .count(op, r.as_ref().err().map(|e| e.code.name()).as_deref());
                    r
                }
                Err(e) => {
                    ctx.ops.count("invalid", Some(&e.code.name()));
                    Err(e)
                }
            }
        };
        let out = reply_bytes(reply);
        match tokio::time::timeout(WRITE, wr.write_all(&out)).await {
            Ok(Ok(())) if !too_long => {}
            _ => return,
        }
    }
}

/// Streams a capture of pipe `name` to the client (see [`crate::capture`]). Errors before the
/// stream starts are sent as the reply; an error is returned for the metrics.
async fn capture(
    ctx: &Arc<Ctx>,
    name: &str,
    snaplen: Option<u32>,
    count: Option<u64>,
    mut rd: BufReader<tokio::net::unix::OwnedReadHalf>,
    mut wr: tokio::net::unix::OwnedWriteHalf,
) -> Result<(), ApiError> {
    use crate::capture::{encode_summary, MAX_CAPTURES, MAX_SNAPLEN, MIN_SNAPLEN};
    let snaplen = snaplen.unwrap_or(MAX_SNAPLEN);
    let started = (|| {
        if !(MIN_SNAPLEN..=MAX_SNAPLEN).contains(&snaplen) {
            return Err(ApiError::new(
                ErrorCode::BadParams,
                format!("snap length {snaplen}: give {MIN_SNAPLEN} to {MAX_SNAPLEN} bytes"),
            ));
        }
        let mut reg = ctx
            .registry
            .lock()
            .map_err(|_| ApiError::new(ErrorCode::Internal, "registry lock poisoned"))?;
        let p = reg.get(name)?.clone();
        // the daemon's own channels would hide the pipe's frames from the capture
        if reg.drop_auto_channels(name) > 0 {
            tracing::info!(pipe = %name, "automatic fast channels removed for a capture");
        }
        let fcs = reg.fc_peers(name);
        let mut caps = ctx
            .captures
            .lock()
            .map_err(|_| ApiError::new(ErrorCode::Internal, "capture lock poisoned"))?;
        if caps.len() >= MAX_CAPTURES {
            return Err(ApiError::new(
                ErrorCode::Busy,
                format!("{MAX_CAPTURES} captures run already; try again later"),
            ));
        }
        if caps.iter().any(|t| t.pipe == p.id) {
            return Err(ApiError::new(
                ErrorCode::Busy,
                format!("pipe {name} is being captured already"),
            ));
        }
        let tap = Arc::new(Tap::new(p.id, snaplen));
        caps.push(tap.clone());
        ctx.master.set_taps(caps.clone());
        Ok((tap, fcs))
    })();
    let (tap, fcs) = match started {
        Ok(x) => x,
        Err(e) => {
            let _ = tokio::time::timeout(WRITE, wr.write_all(&reply_bytes(Err(e.clone())))).await;
            return Err(e);
        }
    };
    tracing::info!(pipe = %name, snaplen, "capture started");
    let reply = to_json(crate::proto::CaptureStarted {
        pipe: name.to_string(),
        snaplen,
        fast_channels: fcs,
    });
    let mut summary = Summary::default();
    let mut out = reply_bytes(reply);
    let mut tick = tokio::time::interval(Duration::from_millis(5));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut probe = [0u8; 64];
    let pipe_id = tap.pipe;
    // set when the client shut its sending side (Ctrl-C): what the tap holds then is sent,
    // then the summary
    let mut stopping = false;
    'stream: loop {
        // frames left in the tap: sent on at once, without waiting for the tick
        let mut more = false;
        while out.len() < 256 * 1024 {
            if count.is_some_and(|c| summary.captured >= c) {
                summary.ended = "count".into();
                break;
            }
            let Some(r) = tap.pop() else { break };
            r.encode(&mut out);
            summary.captured += 1;
            more = out.len() >= 256 * 1024;
        }
        if !out.is_empty() {
            match tokio::time::timeout(WRITE, wr.write_all(&out)).await {
                Ok(Ok(())) => out.clear(),
                _ => {
                    summary.ended = "client".into();
                    break 'stream;
                }
            }
        }
        if !summary.ended.is_empty() {
            break;
        }
        if stopping && !more {
            summary.ended = "stopped".into();
            break;
        }
        let gone = ctx
            .registry
            .lock()
            .map(|r| !r.pipes().any(|p| p.id == pipe_id))
            .unwrap_or(true);
        if gone {
            summary.ended = "removed".into();
            break;
        }
        if stopping {
            continue;
        }
        // a busy pipe (more left in the tap): keep writing, letting the control plane's other
        // tasks run between chunks; else wait for the tick
        let wait = async {
            if more {
                tokio::task::yield_now().await
            } else {
                tick.tick().await;
            }
        };
        tokio::select! {
            biased;
            // the client sends nothing more: a read returns only when it stops (it shut its
            // sending side: the rest and the summary are sent) or went away (the write fails)
            r = rd.read(&mut probe) => {
                match r {
                    Ok(0) => {
                        // nothing more is offered; what the tap holds now is what is left
                        tap.closed.store(true, Ordering::Relaxed);
                        stopping = true;
                    }
                    Ok(_) => {}
                    Err(_) => {
                        summary.ended = "client".into();
                        break;
                    }
                }
            }
            _ = wait => {}
        }
    }
    tap.closed.store(true, Ordering::Relaxed);
    if let Ok(mut caps) = ctx.captures.lock() {
        caps.retain(|t| !Arc::ptr_eq(t, &tap));
        ctx.master.set_taps(caps.clone());
    }
    summary.dropped = tap.dropped.load(Ordering::Relaxed);
    tracing::info!(pipe = %name, captured = summary.captured, dropped = summary.dropped, ended = %summary.ended, "capture ended");
    if summary.ended != "client" {
        let mut b = Vec::new();
        encode_summary(&summary, &mut b);
        let _ = tokio::time::timeout(WRITE, wr.write_all(&b)).await;
        let _ = wr.shutdown().await;
    }
    Ok(())
}

/// Accepts clients until `stop` resolves. Never waits for a free place: a client beyond
/// [`MAX_CONNECTIONS`] gets a `busy` error at once.
pub async fn serve(
    ctx: Arc<Ctx>,
    listener: UnixListener,
    stop: impl std::future::Future<Output = ()>,
) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => return,
            acc = listener.accept() => {
                let Ok((mut s, _)) = acc else { continue };
                match slots.clone().try_acquire_owned() {
                    Ok(permit) => {
                        let ctx = ctx.clone();
                        tokio::spawn(async move {
                            serve_conn(ctx, s).await;
                            drop(permit);
                        });
                    }
                    Err(_) => {
                        tokio::spawn(async move {
                            let busy = reply_bytes(Err(ApiError::new(
                                ErrorCode::Busy,
                                format!("the daemon serves {MAX_CONNECTIONS} clients at once; try again"),
                            )));
                            let _ = tokio::time::timeout(Duration::from_secs(1), s.write_all(&busy)).await;
                        });
                    }
                }
            }
        }
    }
}
