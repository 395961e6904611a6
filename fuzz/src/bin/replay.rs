//! Runs every file of the committed corpus (or of the corpus directories given) through its
//! target, without AFL: `cargo run --release --bin replay [CORPUS...]`. Exits non-zero on a
//! panic, and when it found no input. `replay --write-seeds DIR` writes the seed inputs of every target into DIR.

use std::path::{Path, PathBuf};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--write-seeds") {
        let dir = PathBuf::from(args.get(1).expect("--write-seeds DIR"));
        for (target, name, data) in docknet_fuzz::seeds() {
            let d = dir.join(target);
            std::fs::create_dir_all(&d).expect("creating the corpus directory");
            std::fs::write(d.join(name), data).expect("writing a seed");
        }
        return;
    }
    let roots: Vec<PathBuf> = args.into_iter().map(PathBuf::from).collect();
    let roots = if roots.is_empty() {
        vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus")]
    } else {
        roots
    };
    let mut n = 0;
    for root in roots {
        for (name, target) in docknet_fuzz::TARGETS {
            let dir = root.join(name);
            let Ok(rd) = std::fs::read_dir(&dir) else {
                continue;
            };
            let mut files: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
            files.sort();
            for f in files.iter().filter(|f| f.is_file()) {
                let data = std::fs::read(f).expect("reading a corpus file");
                target(&data);
                n += 1;
            }
        }
    }
    if n == 0 {
        // a corpus that is not where it should be would otherwise pass as "no failure"
        eprintln!("replay: no input found (corpus directories named after the targets)");
        std::process::exit(1);
    }
    println!("replayed {n} inputs, no failure");
}
