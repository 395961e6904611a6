//! AFL target: see `docknet_fuzz::dns`.
fn main() {
    afl::fuzz!(|data: &[u8]| docknet_fuzz::dns(data));
}
