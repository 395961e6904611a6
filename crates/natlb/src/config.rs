//! The command line's backends and ports turned into the balancer's backend list and services
//! (pure, so the rules are tested without a pipe).
//!
//! `--backend IP[:PORT]` names a backend; `--port VPORT[:BPORT]` serves `VIP:VPORT`. The port a
//! connection reaches on a backend is `BPORT` if the `--port` gives one, else the backend's own
//! `PORT`, else `VPORT`. Each distinct backend address and port is one backend (its own health,
//! counters and connections).

use crate::balancer::{Service, MAX_BACKENDS};
use crate::packet::Addr;
use std::net::Ipv4Addr;

/// A `--backend` argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackendSpec {
    /// Address.
    pub ip: Ipv4Addr,
    /// Port, if given.
    pub port: Option<u16>,
}

/// A `--port` argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortSpec {
    /// Port on the VIP.
    pub vport: u16,
    /// Port on the backends, if given.
    pub bport: Option<u16>,
}

fn port(s: &str, what: &str) -> Result<u16, String> {
    match s.parse::<u16>() {
        Ok(p) if p != 0 => Ok(p),
        _ => Err(format!("bad {what} {s:?}: a port is 1 to 65535")),
    }
}

impl std::str::FromStr for BackendSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<BackendSpec, String> {
        let (ip, p) = match s.split_once(':') {
            Some((ip, p)) => (ip, Some(port(p, "backend port")?)),
            None => (s, None),
        };
        let ip = ip
            .parse()
            .map_err(|_| format!("bad backend {s:?}: want IPv4[:PORT], e.g. 10.0.0.3:80"))?;
        Ok(BackendSpec { ip, port: p })
    }
}

impl std::str::FromStr for PortSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<PortSpec, String> {
        Ok(match s.split_once(':') {
            Some((v, b)) => PortSpec {
                vport: port(v, "VIP port")?,
                bport: Some(port(b, "backend port")?),
            },
            None => PortSpec {
                vport: port(s, "VIP port")?,
                bport: None,
            },
        })
    }
}

/// The backend list and the services, or why the arguments do not make one.
pub fn plan(
    vip: Ipv4Addr,
    backends: &[BackendSpec],
    ports: &[PortSpec],
) -> Result<(Vec<Addr>, Vec<Service>), String> {
    if backends.is_empty() {
        return Err("no backend: give at least one --backend IP[:PORT]".into());
    }
    if ports.is_empty() {
        return Err("no port to serve: give at least one --port VPORT[:BACKEND_PORT]".into());
    }
    for (i, b) in backends.iter().enumerate() {
        if b.ip == vip {
            return Err(format!("backend {} is the balancer's own address", b.ip));
        }
        if backends[..i].contains(b) {
            return Err(format!("backend {} given twice", show(b)));
        }
    }
    let mut addrs: Vec<Addr> = Vec::new();
    let mut services = Vec::new();
    for (i, p) in ports.iter().enumerate() {
        if ports[..i].iter().any(|q| q.vport == p.vport) {
            return Err(format!("--port {} given twice", p.vport));
        }
        let mut svc = Service {
            vport: p.vport,
            backends: Vec::new(),
        };
        for b in backends {
            let bport = match (p.bport, b.port) {
                (Some(x), Some(y)) if x != y => {
                    return Err(format!(
                        "--port {}:{x} and --backend {}: two backend ports; give it in one place",
                        p.vport,
                        show(b)
                    ))
                }
                (Some(x), _) | (None, Some(x)) => x,
                (None, None) => p.vport,
            };
            let a = Addr::new(b.ip, bport);
            let idx = match addrs.iter().position(|x| *x == a) {
                Some(i) => i,
                None => {
                    addrs.push(a);
                    addrs.len() - 1
                }
            };
            if !svc.backends.contains(&(idx as u16)) {
                svc.backends.push(idx as u16);
            }
        }
        services.push(svc);
    }
    if addrs.len() > MAX_BACKENDS {
        return Err(format!("{} backends: at most {MAX_BACKENDS}", addrs.len()));
    }
    Ok((addrs, services))
}

fn show(b: &BackendSpec) -> String {
    match b.port {
        Some(p) => format!("{}:{p}", b.ip),
        None => b.ip.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> BackendSpec {
        s.parse().unwrap()
    }
    fn p(s: &str) -> PortSpec {
        s.parse().unwrap()
    }
    const VIP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);

    #[test]
    fn ports_come_from_the_mapping_the_backend_or_the_vip_port() {
        let (a, s) = plan(VIP, &[b("10.0.0.2:8080"), b("10.0.0.3")], &[p("80")]).unwrap();
        assert_eq!(
            a,
            [
                Addr::new([10, 0, 0, 2].into(), 8080),
                Addr::new([10, 0, 0, 3].into(), 80)
            ]
        );
        assert_eq!(
            s,
            [Service {
                vport: 80,
                backends: vec![0, 1]
            }]
        );
        let (a, s) = plan(
            VIP,
            &[b("10.0.0.2"), b("10.0.0.3")],
            &[p("80:8080"), p("443:8443")],
        )
        .unwrap();
        assert_eq!(a.len(), 4);
        assert_eq!(
            s[1],
            Service {
                vport: 443,
                backends: vec![2, 3]
            }
        );
    }

    #[test]
    fn bad_arguments_are_refused_with_a_reason() {
        assert!("10.0.0.2:0".parse::<BackendSpec>().is_err());
        assert!("host:80".parse::<BackendSpec>().is_err());
        assert!("80:x".parse::<PortSpec>().is_err());
        assert!(plan(VIP, &[], &[p("80")])
            .unwrap_err()
            .contains("--backend"));
        assert!(plan(VIP, &[b("10.0.0.2")], &[])
            .unwrap_err()
            .contains("--port"));
        assert!(plan(VIP, &[b("10.0.0.1")], &[p("80")])
            .unwrap_err()
            .contains("own address"));
        assert!(plan(VIP, &[b("10.0.0.2"), b("10.0.0.2")], &[p("80")])
            .unwrap_err()
            .contains("twice"));
        assert!(plan(VIP, &[b("10.0.0.2")], &[p("80"), p("80")])
            .unwrap_err()
            .contains("twice"));
        assert!(plan(VIP, &[b("10.0.0.2:81")], &[p("80:82")])
            .unwrap_err()
            .contains("one place"));
    }
}
