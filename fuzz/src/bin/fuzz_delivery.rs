//! AFL target: see `docknet_fuzz::delivery`.
fn main() {
    afl::fuzz!(|data: &[u8]| docknet_fuzz::delivery(data));
}
