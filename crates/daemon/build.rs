//! Builds the XDP flow director (`bpf/flow_director.c`) into a BPF object the daemon embeds.
//! Needs clang and the libbpf headers (Debian: clang, libbpf-dev; `./scripts/setup.sh`
//! installs them).

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let src = "bpf/flow_director.c";
    println!("cargo:rerun-if-changed={src}");
    println!("cargo:rerun-if-env-changed=DOCKNET_CLANG");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("flow_director.o");
    let clang = std::env::var("DOCKNET_CLANG").unwrap_or_else(|_| "clang".into());
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_else(|_| "x86_64".into());
    // <asm/types.h> lives in the multiarch include directory on Debian
    let multiarch = format!("/usr/include/{arch}-linux-gnu");
    let status = Command::new(&clang)
        .args(["-O2", "-g", "-Wall", "-Werror", "-target", "bpf"])
        .arg(format!("-I{multiarch}"))
        .args(["-c", src, "-o"])
        .arg(&out)
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!(
            "building the XDP flow director with {clang} failed ({s}); are the libbpf headers \
             installed (Debian: libbpf-dev)? ./scripts/setup.sh installs what the build needs"
        ),
        Err(e) => panic!(
            "cannot run {clang} to build the XDP flow director ({e}): install clang and \
             libbpf-dev (./scripts/setup.sh does)"
        ),
    }
}
