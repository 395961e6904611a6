//! AFL target: see `docknet_fuzz::master`.
fn main() {
    afl::fuzz!(|data: &[u8]| docknet_fuzz::master(data));
}
