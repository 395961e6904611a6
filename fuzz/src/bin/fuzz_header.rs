//! AFL target: see `docknet_fuzz::header`.
fn main() {
    afl::fuzz!(|data: &[u8]| docknet_fuzz::header(data));
}
