//! The control socket: a tokio task per connection, one JSON request and reply per line.
//! All state changes go through one mutex-guarded [`Registry`]; each change publishes a new
//! snapshot to the master thread.

use crate::master::MasterShared;
use crate::proto::{
    parse_request, ApiError, ErrorCode, Removed, Reply, Request, Status, MAX_LINE, PROTOCOL_VERSION,
};
use crate::registry::Registry;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Semaphore;

/// Most connections served at once; more wait for a free place.
const MAX_CONNECTIONS: usize = 64;
/// A connection idle this long is closed.
const IDLE: Duration = Duration::from_secs(60);

/// Everything a request handler needs.
#[derive(Debug)]
pub struct Ctx {
    /// Pipes and channels.
    pub registry: Mutex<Registry>,
    /// The master thread's shared state.
    pub master: Arc<MasterShared>,
    /// Static facts reported by `status` (its totals are filled in per request).
    pub info: Status,
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
    );
    let out = match req {
        Request::Status {} => to_json(Status {
            pipes: reg.pipes().count(),
            forwarded: ctx.master.forwarded.load(Ordering::Relaxed),
            master_sleeps: ctx.master.sleeps.load(Ordering::Relaxed),
            ..ctx.info.clone()
        }),
        Request::PipeCreate {
            name,
            ip,
            mtu,
            ring_depth,
        } => {
            let p = reg.create_pipe(&name, &ip, mtu, ring_depth)?;
            tracing::info!(pipe = %name, ip = %ip, "pipe created");
            to_json(reg.pipe_info(&p, false))
        }
        Request::PipeRm { name } => {
            reg.remove_pipe(&name)?;
            tracing::info!(pipe = %name, "pipe removed");
            to_json(Removed::Pipe { removed: name })
        }
        Request::PipeLs {} => to_json(
            reg.pipes()
                .map(|p| reg.pipe_info(p, false))
                .collect::<Vec<_>>(),
        ),
        Request::PipeShow { name } => {
            let p = reg.get(&name)?.clone();
            to_json(reg.pipe_info(&p, true))
        }
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
    };
    if changed && out.is_ok() {
        ctx.master.publish(reg.snapshot());
    }
    out
}

async fn serve_conn(ctx: Arc<Ctx>, stream: UnixStream) {
    let (rd, mut wr) = stream.into_split();
    let mut rd = BufReader::new(rd);
    loop {
        let mut line = Vec::new();
        let n = match tokio::time::timeout(
            IDLE,
            (&mut rd)
                .take(MAX_LINE as u64 + 1)
                .read_until(b'\n', &mut line),
        )
        .await
        {
            Ok(Ok(n)) => n,
            _ => return,
        };
        if n == 0 {
            return;
        }
        let too_long = line.len() > MAX_LINE;
        let reply = if too_long {
            Reply::from_result(Err(ApiError::new(
                ErrorCode::BadRequest,
                format!("request longer than {MAX_LINE} bytes"),
            )))
        } else {
            let text = String::from_utf8_lossy(&line);
            let text = text.trim();
            if text.is_empty() {
                continue;
            }
            let ctx2 = ctx.clone();
            let r = match parse_request(text) {
                Ok(req) => tokio::task::spawn_blocking(move || handle(&ctx2, req))
                    .await
                    .unwrap_or_else(|e| Err(ApiError::new(ErrorCode::Internal, e.to_string()))),
                Err(e) => Err(e),
            };
            Reply::from_result(r)
        };
        let mut out = serde_json::to_vec(&reply)
            .unwrap_or_else(|_| format!("{{\"v\":{PROTOCOL_VERSION},\"ok\":false}}").into_bytes());
        out.push(b'\n');
        if wr.write_all(&out).await.is_err() || too_long {
            return;
        }
    }
}

/// Accepts connections until `stop` resolves.
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
                let Ok((s, _)) = acc else { continue };
                let Ok(permit) = slots.clone().acquire_owned().await else { return };
                let ctx = ctx.clone();
                tokio::spawn(async move {
                    serve_conn(ctx, s).await;
                    drop(permit);
                });
            }
        }
    }
}
