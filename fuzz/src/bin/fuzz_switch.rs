//! AFL target: see `docknet_fuzz::switch`.
fn main() {
    afl::fuzz!(|data: &[u8]| docknet_fuzz::switch(data));
}
