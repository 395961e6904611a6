//! Services: setting, removing and listing them, and handing the table to every container.
//!
//! The daemon never translates a frame for a service. It sends each container the whole table
//! as a sealed memfd ([`docknet_pipe::services`]) and DockLib connects to a backend in place
//! of the service's address. A change reaches every connected container at once (a message on
//! its connection and a bump of its pipe's generation word, which wakes its sleepers); a
//! container that attaches later gets the table before `Synced`.

use super::validate::validate_name;
use super::{err, internal, Registry};
use crate::proto::{ApiError, ErrorCode, ServiceAffinity, ServiceInfo, ServiceProto};
use docknet_pipe::delivery::Msg;
use docknet_pipe::layout;
use docknet_pipe::services::{
    self, Affinity, Proto, Service, Table, MAX_BACKENDS, MAX_SERVICES, MAX_TOTAL_BACKENDS,
};
use std::collections::{BTreeMap, HashSet};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::OwnedFd;

/// The services of a daemon and the table last handed out.
#[derive(Debug, Default)]
pub(super) struct Services {
    pub(super) list: BTreeMap<String, ServiceInfo>,
    /// The sealed table and its length, once one was made.
    table: Option<(OwnedFd, u32)>,
}

fn proto_of(p: ServiceProto) -> Proto {
    match p {
        ServiceProto::Tcp => Proto::Tcp,
        ServiceProto::Udp => Proto::Udp,
    }
}

fn bad(msg: String) -> ApiError {
    err(ErrorCode::BadIp, msg)
}

/// An `IP:PORT` of a service or a backend: a usable unicast address and a port other than 0.
fn parse_addr(what: &str, s: &str) -> Result<SocketAddrV4, ApiError> {
    let a: SocketAddrV4 = s.parse().map_err(|_| {
        bad(format!(
            "invalid {what} {s:?}: expected IPv4 address and port, e.g. 10.96.0.10:80"
        ))
    })?;
    if !services::usable(*a.ip()) {
        return Err(bad(format!(
            "invalid {what} {s:?}: not a unicast address (0.0.0.0/8, loopback, multicast and \
             broadcast cannot be one)"
        )));
    }
    if a.port() == 0 {
        return Err(bad(format!("invalid {what} {s:?}: port 0")));
    }
    Ok(a)
}

/// The table entry of a service already checked ([`Registry::check_service`] wrote its fields).
fn entry_of(s: &ServiceInfo) -> Option<Service> {
    let vip: SocketAddrV4 = s.address.parse().ok()?;
    Some(Service {
        vip: *vip.ip(),
        port: vip.port(),
        proto: proto_of(s.proto),
        affinity: match s.affinity {
            ServiceAffinity::None => Affinity::None,
            ServiceAffinity::ClientIp => Affinity::ClientIp,
        },
        backends: s.backends.iter().filter_map(|b| b.parse().ok()).collect(),
    })
}

impl Registry {
    /// Checks `s` as a request would be, against the services other than its own name and the
    /// pipes, and returns it in its canonical form.
    fn check_service(&self, s: &ServiceInfo) -> Result<ServiceInfo, ApiError> {
        validate_name(&s.name).map_err(|_| {
            err(
                ErrorCode::BadName,
                format!("invalid service name {:?}", s.name),
            )
        })?;
        let vip = parse_addr("service address", &s.address)?;
        if let Some(p) = self.pipes.values().find(|p| p.ip == *vip.ip()) {
            return Err(err(
                ErrorCode::IpInUse,
                format!(
                    "service address {} is pipe {:?}'s address: a service needs an address of \
                     its own (a ClusterIP range apart from the pods')",
                    vip.ip(),
                    p.name
                ),
            ));
        }
        let others = || self.services.list.values().filter(|o| o.name != s.name);
        if let Some(o) = others().find(|o| o.address == vip.to_string() && o.proto == s.proto) {
            return Err(err(
                ErrorCode::Exists,
                format!(
                    "{} {vip} is already service {:?}",
                    proto_of(s.proto),
                    o.name
                ),
            ));
        }
        if others().count() >= MAX_SERVICES {
            return Err(err(
                ErrorCode::BadParams,
                format!("this daemon has {MAX_SERVICES} services, the most it keeps"),
            ));
        }
        if s.backends.len() > MAX_BACKENDS {
            return Err(err(
                ErrorCode::BadParams,
                format!(
                    "{} backends: a service has at most {MAX_BACKENDS}",
                    s.backends.len()
                ),
            ));
        }
        let total: usize = others().map(|o| o.backends.len()).sum::<usize>() + s.backends.len();
        if total > MAX_TOTAL_BACKENDS {
            return Err(err(
                ErrorCode::BadParams,
                format!(
                    "services would have {total} backends in all; the most is {MAX_TOTAL_BACKENDS}"
                ),
            ));
        }
        let vips: HashSet<Ipv4Addr> = others()
            .filter_map(|o| o.address.parse::<SocketAddrV4>().ok())
            .map(|a| *a.ip())
            .chain([*vip.ip()])
            .collect();
        let mut backends = Vec::with_capacity(s.backends.len());
        for b in &s.backends {
            let a = parse_addr("backend", b)?;
            if vips.contains(a.ip()) {
                return Err(bad(format!(
                    "backend {a} is a service's address: a backend is a pod's"
                )));
            }
            if backends.contains(&a) {
                return Err(bad(format!("backend {a} is listed twice")));
            }
            backends.push(a);
        }
        Ok(ServiceInfo {
            name: s.name.clone(),
            address: vip.to_string(),
            proto: s.proto,
            backends: backends.iter().map(|b| b.to_string()).collect(),
            affinity: s.affinity,
        })
    }

    /// Adds or replaces the service `s.name`, saves it, and hands the new table to every
    /// container.
    pub fn set_service(&mut self, s: &ServiceInfo) -> Result<ServiceInfo, ApiError> {
        let info = self.check_service(s)?;
        let mut list = self.services.list.clone();
        list.insert(info.name.clone(), info.clone());
        self.write_services(list)?;
        Ok(info)
    }

    /// Removes the service `name`, saves that, and hands the new table to every container.
    pub fn remove_service(&mut self, name: &str) -> Result<ServiceInfo, ApiError> {
        let mut list = self.services.list.clone();
        let gone = list
            .remove(name)
            .ok_or_else(|| err(ErrorCode::NotFound, format!("no service {name:?}")))?;
        self.write_services(list)?;
        Ok(gone)
    }

    /// Every service, by name.
    pub fn services(&self) -> Vec<ServiceInfo> {
        self.services.list.values().cloned().collect()
    }

    /// Whether `ip` is a service's address.
    pub(super) fn is_service_address(&self, ip: Ipv4Addr) -> Option<&str> {
        self.services
            .list
            .values()
            .find(|s| {
                s.address
                    .parse::<SocketAddrV4>()
                    .is_ok_and(|a| *a.ip() == ip)
            })
            .map(|s| s.name.as_str())
    }

    /// Adopts the services `state.json` records, each checked again as a request would be
    /// (against those adopted before it); returns warnings for those refused.
    pub(super) fn adopt_services(&mut self, recs: &[ServiceInfo]) -> Vec<String> {
        let mut warnings = Vec::new();
        for s in recs.iter().take(MAX_SERVICES + 1) {
            match self.check_service(s) {
                Ok(info) => {
                    self.services.list.insert(info.name.clone(), info);
                }
                Err(e) => warnings.push(format!("service {:?} not adopted: {}", s.name, e.message)),
            }
        }
        if !self.services.list.is_empty() {
            if let Err(e) = self.publish_services() {
                warnings.push(format!("services not handed out: {}", e.message));
            }
        }
        warnings
    }

    /// Writes the state with `list` first; takes `list` and hands it out only when that
    /// worked.
    fn write_services(&mut self, list: BTreeMap<String, ServiceInfo>) -> Result<(), ApiError> {
        let mut st = self.state();
        st.services = list.values().cloned().collect();
        self.write(&st).map_err(|e| internal("saving state", e))?;
        self.services.list = list;
        self.publish_services()
    }

    /// Makes the sealed table of the current services and sends it to every container.
    fn publish_services(&mut self) -> Result<(), ApiError> {
        let entries: Vec<Service> = self.services.list.values().filter_map(entry_of).collect();
        let bytes = Table::encode(&entries);
        let fd = services::sealed(&bytes).map_err(|e| internal("making the services table", e))?;
        let len = bytes.len() as u32;
        let msg = Msg::Services { len }.encode();
        let names: Vec<String> = self.pipes.keys().cloned().collect();
        for name in names {
            self.send_all(&name, &msg, Some(&fd));
            if let Some(p) = self.pipes.get(&name) {
                layout::bump_generation(&p.region, &p.info.rings[1]);
            }
        }
        self.services.table = Some((fd, len));
        Ok(())
    }

    /// The message and table a newly attached container gets before `Synced`, if there are
    /// services (or were: an empty table replaces an old one after a reconnect).
    pub(super) fn services_msg(&self) -> Option<(Vec<u8>, &OwnedFd)> {
        self.services
            .table
            .as_ref()
            .map(|(fd, len)| (Msg::Services { len: *len }.encode(), fd))
    }

    /// Number of services.
    pub fn service_count(&self) -> usize {
        self.services.list.len()
    }
}
