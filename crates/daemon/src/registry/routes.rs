//! Routes to networks beyond the link: adding, removing and listing them.

use super::validate::parse_net;
use super::{err, internal, Registry};
use crate::proto::{ApiError, ErrorCode};
use crate::route::{Route, RouteError, Routes};
use std::net::Ipv4Addr;
use std::sync::Arc;

fn api(e: RouteError) -> ApiError {
    let code = match e {
        RouteError::Exists(_) => ErrorCode::Exists,
        RouteError::Missing(..) => ErrorCode::NotFound,
        RouteError::Full => ErrorCode::BadParams,
        _ => ErrorCode::BadIp,
    };
    err(code, e.to_string())
}

impl Registry {
    /// Adds a route to `net` (`A.B.C.D/LEN`) through `via` (through a VXLAN tunnel to `via`
    /// with `vxlan`'s network identifier), checked, and saves it.
    pub fn add_route(
        &mut self,
        net: &str,
        via: &str,
        vxlan: Option<u32>,
    ) -> Result<Route, ApiError> {
        let (net, prefix) = parse_net(net)?;
        if self.gateway.is_none() {
            return Err(err(
                ErrorCode::BadParams,
                "this daemon drives no link: routes need one (docknet daemon --nic IFACE)",
            ));
        }
        if self.host_link {
            return Err(err(
                ErrorCode::BadParams,
                "this daemon's link is the host's own kernel (--host-link): the host's routes \
                 carry what leaves the pipes (ip route add NET via NODE on the host)",
            ));
        }
        let via: Ipv4Addr = via.parse().map_err(|_| {
            err(
                ErrorCode::BadIp,
                format!("invalid next hop {via:?}: not an IPv4 address"),
            )
        })?;
        if let Some(p) = self.pipes.values().find(|p| p.ip == via) {
            return Err(err(
                ErrorCode::BadIp,
                format!(
                    "next hop {via} is pipe {:?}'s address: a next hop is on the link",
                    p.name
                ),
            ));
        }
        if vxlan.is_some() {
            match self.link_addr {
                None => {
                    return Err(err(
                        ErrorCode::BadParams,
                        "the link has no IPv4 address, and a VXLAN tunnel's datagrams leave \
                         from it: give the link an address (ip addr add ADDR/LEN dev IFACE) and \
                         restart the daemon",
                    ))
                }
                Some(own) if own == via => {
                    return Err(err(
                        ErrorCode::BadIp,
                        format!("{via} is this node's own address: a tunnel goes to another node"),
                    ))
                }
                Some(_) => {}
            }
        }
        let r = Route {
            net,
            prefix,
            via,
            vxlan,
        };
        let t = self.routes.with(r).map_err(api)?;
        self.write_routes(t)?;
        Ok(r)
    }

    /// Removes the route to `net` (`A.B.C.D/LEN`), and saves that.
    pub fn remove_route(&mut self, net: &str) -> Result<Route, ApiError> {
        let (net, prefix) = parse_net(net)?;
        let gone = self
            .routes
            .get(net, prefix)
            .ok_or_else(|| api(RouteError::Missing(net, prefix)))?;
        let t = self.routes.without(net, prefix).map_err(api)?;
        self.write_routes(t)?;
        Ok(gone)
    }

    /// Every route, sorted by network.
    pub fn routes(&self) -> Vec<Route> {
        self.routes.list().to_vec()
    }

    /// Writes the state with `t` first, and takes `t` only when that worked.
    fn write_routes(&mut self, t: Routes) -> Result<(), ApiError> {
        let mut st = self.state();
        st.routes = t.list().to_vec();
        self.write(&st).map_err(|e| internal("saving state", e))?;
        self.routes = Arc::new(t);
        Ok(())
    }
}
