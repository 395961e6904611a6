//! AFL target: see `docknet_fuzz::channel`.
fn main() {
    afl::fuzz!(|data: &[u8]| docknet_fuzz::channel(data));
}
