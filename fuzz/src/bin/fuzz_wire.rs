//! AFL target: see `docknet_fuzz::wire`.
fn main() {
    afl::fuzz!(|data: &[u8]| docknet_fuzz::wire(data));
}
