//! Rate limits: setting, clearing and reporting a pipe's limits, and the limiters' timers.

use super::{err, internal, mtu_frame, Registry};
use crate::proto::{ApiError, ErrorCode, RateChange, RateDir, RateInfo};
use crate::rate::{Limit, Limits, Timers};
use std::sync::atomic::{AtomicU64, Ordering};

impl Registry {
    /// Sets the rate limiters' timers (the daemon's `--rate-fine` and `--rate-coarse`).
    pub fn set_timers(&mut self, timers: Timers) {
        self.timers = timers;
    }

    /// Changes pipe `name`'s limits: each direction given is set (rate in bits/s, burst in
    /// bits; `None` burst: the default), the others are kept. Checked first; written ahead.
    pub fn set_rate(&mut self, name: &str, change: &RateChange) -> Result<RateInfo, ApiError> {
        let pipe = self.get(name)?.clone();
        let frame = mtu_frame(&pipe.info);
        let mut l = self.limits.get(name).copied().unwrap_or_default();
        let make = |rate: Option<u64>, burst: Option<u64>, what: &str| {
            rate.map(|r| {
                Limit::new(r, burst, frame, self.timers.coarse)
                    .map_err(|e| err(ErrorCode::BadParams, format!("{what}: {e}")))
            })
            .transpose()
        };
        if change.egress_bps.is_none() && change.ingress_bps.is_none() {
            return Err(err(
                ErrorCode::BadParams,
                "give an egress or an ingress rate (or clear the limits)",
            ));
        }
        if (change.egress_burst_bits.is_some() && change.egress_bps.is_none())
            || (change.ingress_burst_bits.is_some() && change.ingress_bps.is_none())
        {
            return Err(err(ErrorCode::BadParams, "a burst needs its rate"));
        }
        if let Some(e) = make(change.egress_bps, change.egress_burst_bits, "egress")? {
            l.egress = Some(e);
        }
        if let Some(i) = make(change.ingress_bps, change.ingress_burst_bits, "ingress")? {
            l.ingress = Some(i);
        }
        self.write_limits(name, l)?;
        // an automatic channel would pass the limit by
        self.drop_auto_channels(name);
        self.rate_info(name)
    }

    /// Removes pipe `name`'s limits.
    pub fn clear_rate(&mut self, name: &str) -> Result<RateInfo, ApiError> {
        self.get(name)?;
        self.write_limits(name, Limits::default())?;
        self.rate_info(name)
    }

    fn write_limits(&mut self, name: &str, l: Limits) -> Result<(), ApiError> {
        let mut st = self.state();
        for p in st.pipes.iter_mut().filter(|p| p.name == name) {
            p.limits = l;
        }
        self.write(&st).map_err(|e| internal("saving state", e))?;
        if l.is_empty() {
            self.limits.remove(name);
        } else {
            self.limits.insert(name.into(), l);
        }
        Ok(())
    }

    /// Pipe `name`'s limits and its limiters' state.
    pub fn rate_info(&self, name: &str) -> Result<RateInfo, ApiError> {
        let p = self.get(name)?;
        let l = self.limits.get(name).copied().unwrap_or_default();
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let dir = |lim: Option<Limit>, st: &[AtomicU64]| {
            lim.map(|lim| RateDir {
                rate_bps: lim.rate_bps,
                burst_bits: lim.burst_bits,
                tokens_bits: ld(&st[0]),
                passed_bytes: ld(&st[1]),
                waits: ld(&st[2]),
                queued_bytes: st.get(3).map(ld),
            })
        };
        Ok(RateInfo {
            pipe: name.into(),
            egress_bps: l.egress.map(|x| x.rate_bps),
            ingress_bps: l.ingress.map(|x| x.rate_bps),
            egress: dir(l.egress, &p.rate.egress),
            ingress: dir(l.ingress, &p.rate.ingress),
            fine_us: self.timers.fine.as_micros() as u64,
            coarse_ms: self.timers.coarse.as_millis() as u64,
        })
    }
}
