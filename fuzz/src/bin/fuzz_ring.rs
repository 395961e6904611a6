//! AFL target: see `docknet_fuzz::ring`.
fn main() {
    afl::fuzz!(|data: &[u8]| docknet_fuzz::ring(data));
}
