//! AFL target: see `docknet_fuzz::segment`.
fn main() {
    afl::fuzz!(|data: &[u8]| docknet_fuzz::segment(data));
}
