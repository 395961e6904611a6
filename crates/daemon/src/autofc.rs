//! The control plane's side of automatic fast channels: serves the masters' asks (pairs of
//! pipes they saw talk) and removes automatic channels that went idle. The policy is the
//! registry's ([`crate::registry::Registry::auto_connect`]); this only drives it.

use crate::control::Ctx;
use crate::registry::AutoOutcome;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often idle automatic channels are looked for.
const REAP_EVERY: Duration = Duration::from_secs(5);

/// Serves asks until the task is dropped.
pub async fn serve(ctx: Arc<Ctx>) {
    let mut reap = tokio::time::interval(REAP_EVERY);
    reap.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ctx.master.talk_bell.notified() => serve_asks(&ctx),
            _ = reap.tick() => reap_idle(&ctx),
        }
    }
}

/// Serves every ask waiting now.
pub fn serve_asks(ctx: &Ctx) {
    // the registry first, then the captures, as a capture's start takes them: a capture that
    // starts meanwhile finds the channel made and removes it
    let Ok(mut reg) = ctx.registry.lock() else {
        return;
    };
    let captured: Vec<u64> = ctx
        .captures
        .lock()
        .map(|c| c.iter().map(|t| t.pipe).collect())
        .unwrap_or_default();
    while let Some((from, to)) = ctx.master.talkers.pop() {
        let t0 = Instant::now();
        match reg.auto_connect(from, to, &captured) {
            AutoOutcome::Made(f) => {
                tracing::info!(a = %f.a, b = %f.b, us = t0.elapsed().as_micros() as u64, "fast channel connected automatically")
            }
            AutoOutcome::Skipped(why) => {
                tracing::debug!(from, to, why, "no automatic fast channel")
            }
        }
    }
}

fn reap_idle(ctx: &Ctx) {
    let Ok(mut reg) = ctx.registry.lock() else {
        return;
    };
    for (a, b) in reg.reap_auto_channels(Instant::now()) {
        tracing::info!(a = %a, b = %b, "idle automatic fast channel removed");
    }
}
