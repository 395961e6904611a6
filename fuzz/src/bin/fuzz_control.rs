//! AFL target: see `docknet_fuzz::control`.
fn main() {
    afl::fuzz!(|data: &[u8]| docknet_fuzz::control(data));
}
