//! The control-socket client: one request per call, blocking.

use super::*;

/// Why a client call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nothing listens on the socket.
    #[error("docknet daemon not running (no socket at {0}); start it with `docknet daemon`")]
    NotRunning(String),
    /// Socket I/O failed.
    #[error("control socket {path}: {source}")]
    Io {
        /// Socket path.
        path: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The daemon's reply did not parse.
    #[error("daemon sent an unreadable reply: {0}")]
    BadReply(String),
    /// The daemon refused the request.
    #[error(transparent)]
    Api(#[from] ApiError),
}

/// How long a client keeps asking a daemon that answers `busy`.
pub const BUSY_PATIENCE: Duration = Duration::from_secs(30);

/// A blocking control-socket client (one request per call).
#[derive(Debug)]
pub struct Client {
    path: String,
    stream: BufReader<UnixStream>,
}

impl Client {
    /// Connects to the daemon at `path`.
    pub fn connect(path: &Path) -> Result<Client, ClientError> {
        let p = path.display().to_string();
        let s = UnixStream::connect(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
                ClientError::NotRunning(p.clone())
            }
            _ => ClientError::Io {
                path: p.clone(),
                source: e,
            },
        })?;
        let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
        Ok(Client {
            path: p,
            stream: BufReader::new(s),
        })
    }

    /// Sends a request and waits for its reply.
    pub fn call(&mut self, r: &Request) -> Result<serde_json::Value, ClientError> {
        self.call_raw(&encode_request(r))
    }

    /// Sends a request and reads its reply as `T`.
    pub fn call_as<T: serde::de::DeserializeOwned>(
        &mut self,
        r: &Request,
    ) -> Result<T, ClientError> {
        let v = self.call(r)?;
        serde_json::from_value(v).map_err(|e| ClientError::BadReply(e.to_string()))
    }

    /// `status`.
    pub fn status(&mut self) -> Result<Status, ClientError> {
        self.call_as(&Request::Status {})
    }

    /// `pipe create`.
    pub fn pipe_create(
        &mut self,
        name: &str,
        ip: &str,
        mtu: Option<u32>,
        ring_depth: Option<u32>,
    ) -> Result<PipeInfo, ClientError> {
        self.pipe_create_labeled(name, ip, mtu, ring_depth, BTreeMap::new())
    }

    /// `pipe create --label KEY=VALUE ...`.
    pub fn pipe_create_labeled(
        &mut self,
        name: &str,
        ip: &str,
        mtu: Option<u32>,
        ring_depth: Option<u32>,
        labels: BTreeMap<String, String>,
    ) -> Result<PipeInfo, ClientError> {
        self.pipe_create_dual(name, ip, None, mtu, ring_depth, labels)
    }

    /// `pipe create --ip6 X::Y/LEN ...`: a dual-stack pipe.
    pub fn pipe_create_dual(
        &mut self,
        name: &str,
        ip: &str,
        ip6: Option<&str>,
        mtu: Option<u32>,
        ring_depth: Option<u32>,
        labels: BTreeMap<String, String>,
    ) -> Result<PipeInfo, ClientError> {
        self.call_as(&Request::PipeCreate {
            name: name.into(),
            ip: ip.into(),
            ip6: ip6.map(Into::into),
            mtu,
            ring_depth,
            labels,
        })
    }

    /// `pipe rm`.
    pub fn pipe_rm(&mut self, name: &str) -> Result<Removed, ClientError> {
        self.call_as(&Request::PipeRm { name: name.into() })
    }

    /// `pipe ls`.
    pub fn pipe_ls(&mut self) -> Result<Vec<PipeInfo>, ClientError> {
        self.call_as(&Request::PipeLs {})
    }

    /// `pipe show` (with counters).
    pub fn pipe_show(&mut self, name: &str) -> Result<PipeInfo, ClientError> {
        self.call_as(&Request::PipeShow { name: name.into() })
    }

    /// `fc connect`.
    pub fn fc_connect(
        &mut self,
        a: &str,
        b: &str,
        mtu: Option<u32>,
    ) -> Result<FcInfo, ClientError> {
        self.call_as(&Request::FcConnect {
            a: a.into(),
            b: b.into(),
            mtu,
        })
    }

    /// `pipe attach`: binds the pipe's socket in the network namespace at `netns`.
    pub fn pipe_attach(
        &mut self,
        name: &str,
        netns: &str,
        socket: Option<&str>,
    ) -> Result<Attached, ClientError> {
        self.call_as(&Request::PipeAttach {
            name: name.into(),
            netns: netns.into(),
            socket: socket.map(String::from),
        })
    }

    /// `pipe detach`.
    pub fn pipe_detach(&mut self, name: &str) -> Result<Removed, ClientError> {
        self.call_as(&Request::PipeDetach { name: name.into() })
    }

    /// `fc rm`.
    pub fn fc_rm(&mut self, a: &str, b: &str) -> Result<Removed, ClientError> {
        self.call_as(&Request::FcRm {
            a: a.into(),
            b: b.into(),
        })
    }

    /// `rate set`: the directions given in `c` are set, the others kept.
    pub fn rate_set(&mut self, name: &str, c: &RateChange) -> Result<RateInfo, ClientError> {
        self.call_as(&Request::RateSet {
            name: name.into(),
            egress_bps: c.egress_bps,
            ingress_bps: c.ingress_bps,
            egress_burst_bits: c.egress_burst_bits,
            ingress_burst_bits: c.ingress_burst_bits,
        })
    }

    /// `rate clear`.
    pub fn rate_clear(&mut self, name: &str) -> Result<RateInfo, ClientError> {
        self.call_as(&Request::RateClear { name: name.into() })
    }

    /// `stats`.
    pub fn stats(&mut self) -> Result<Stats, ClientError> {
        self.call_as(&Request::Stats {})
    }

    /// Starts capturing pipe `name`: the reply, and the connection to read the records from
    /// ([`crate::capture::read_record`]), with no read timeout (a quiet pipe sends nothing).
    pub fn capture(
        mut self,
        name: &str,
        snaplen: Option<u32>,
        count: Option<u64>,
    ) -> Result<(CaptureStarted, BufReader<UnixStream>), ClientError> {
        let started = self.call_as(&Request::Capture {
            name: name.into(),
            snaplen,
            count,
        })?;
        let _ = self.stream.get_ref().set_read_timeout(None);
        Ok((started, self.stream))
    }

    /// `route add` (through a VXLAN tunnel with `vxlan`'s identifier when given).
    pub fn route_add(
        &mut self,
        net: &str,
        via: &str,
        vxlan: Option<u32>,
    ) -> Result<RouteInfo, ClientError> {
        self.call_as(&Request::RouteAdd {
            net: net.into(),
            via: via.into(),
            vxlan,
        })
    }

    /// `route rm`.
    pub fn route_rm(&mut self, net: &str) -> Result<RouteInfo, ClientError> {
        self.call_as(&Request::RouteRm { net: net.into() })
    }

    /// `route ls`.
    pub fn route_ls(&mut self) -> Result<Vec<RouteInfo>, ClientError> {
        self.call_as(&Request::RouteLs {})
    }

    /// `service set`: adds or replaces the service `s.name`.
    pub fn service_set(&mut self, s: &ServiceInfo) -> Result<ServiceInfo, ClientError> {
        self.call_as(&Request::ServiceSet {
            name: s.name.clone(),
            address: s.address.clone(),
            proto: s.proto,
            backends: s.backends.clone(),
            affinity: s.affinity,
        })
    }

    /// `service rm`.
    pub fn service_rm(&mut self, name: &str) -> Result<ServiceInfo, ClientError> {
        self.call_as(&Request::ServiceRm { name: name.into() })
    }

    /// `service ls`.
    pub fn service_ls(&mut self) -> Result<Vec<ServiceInfo>, ClientError> {
        self.call_as(&Request::ServiceLs {})
    }

    /// `rate show`.
    pub fn rate_show(&mut self, name: &str) -> Result<RateInfo, ClientError> {
        self.call_as(&Request::RateShow { name: name.into() })
    }

    /// Sends a raw line (tests use it for malformed requests). A daemon that answers `busy`
    /// (it serves its most clients at once) is asked again on a new connection, backing off
    /// from 5 ms to 200 ms, for up to [`BUSY_PATIENCE`].
    pub fn call_raw(&mut self, line: &str) -> Result<serde_json::Value, ClientError> {
        let start = std::time::Instant::now();
        let mut pause = Duration::from_millis(5);
        loop {
            match self.call_once(line) {
                Err(ClientError::Api(e))
                    if e.code == ErrorCode::Busy && start.elapsed() < BUSY_PATIENCE =>
                {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(200));
                    *self = Client::connect(Path::new(&self.path))?;
                }
                r => return r,
            }
        }
    }

    fn call_once(&mut self, line: &str) -> Result<serde_json::Value, ClientError> {
        let io = |source| ClientError::Io {
            path: self.path.clone(),
            source,
        };
        let s = self.stream.get_mut();
        // a daemon at its limit writes `busy` and closes without reading: the write may fail,
        // and the reply still says why
        let wrote = s
            .write_all(line.as_bytes())
            .and_then(|()| s.write_all(b"\n"));
        let mut buf = String::new();
        let read = self.stream.read_line(&mut buf);
        if buf.is_empty() {
            return Err(match (wrote, read) {
                (Err(e), _) | (Ok(()), Err(e)) => io(e),
                (Ok(()), Ok(_)) => ClientError::BadReply("connection closed".into()),
            });
        }
        let rep: Reply =
            serde_json::from_str(&buf).map_err(|e| ClientError::BadReply(e.to_string()))?;
        match (rep.ok, rep.result, rep.error) {
            (true, r, _) => Ok(r.unwrap_or(serde_json::Value::Null)),
            (false, _, Some(e)) => Err(ClientError::Api(e)),
            (false, _, None) => Err(ClientError::BadReply("error without details".into())),
        }
    }
}
