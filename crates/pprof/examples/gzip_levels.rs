//! What each gzip level costs on a real profile: the time to compress it
//! (median of 5) and the bytes it comes to, with the flate2 backend the
//! gem uses. The profile is read as written (gzipped or not).
//!
//!     cargo run --release -p memprofiler_pprof_format --example gzip_levels -- PROFILE.pprof

use std::io::{Read, Write};
use std::time::Instant;

use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use flate2::Compression;

fn main() {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: gzip_levels PROFILE.pprof");
        std::process::exit(1);
    };
    let bytes = std::fs::read(&path).unwrap_or_else(|e| {
        eprintln!("gzip_levels: cannot read {path}: {e}");
        std::process::exit(1);
    });
    let raw = if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut raw = Vec::new();
        if let Err(e) = GzDecoder::new(&bytes[..]).read_to_end(&mut raw) {
            eprintln!("gzip_levels: {path} is not valid gzip: {e}");
            std::process::exit(1);
        }
        raw
    } else {
        bytes
    };
    println!("{path}: {} bytes of protobuf", raw.len());
    println!("level  gzipped bytes  vs level 6  time (ms)");
    let mut rows = Vec::new();
    for level in 1..=9 {
        let mut times = Vec::new();
        let mut size = 0;
        for _ in 0..5 {
            let began = Instant::now();
            let mut encoder = GzEncoder::new(Vec::new(), Compression::new(level));
            encoder
                .write_all(&raw)
                .expect("writing to a Vec cannot fail");
            size = encoder
                .finish()
                .expect("writing to a Vec cannot fail")
                .len();
            times.push(began.elapsed().as_secs_f64() * 1000.0);
        }
        times.sort_by(f64::total_cmp);
        rows.push((level, size, times[times.len() / 2]));
    }
    let level6 = rows[5].1 as f64;
    for (level, size, ms) in rows {
        let marker = if level == memprofiler_pprof_format::gzip::LEVEL {
            "  (the gem's)"
        } else {
            ""
        };
        println!(
            "{level:>5}  {size:>13}  {:>10.3}  {ms:>9.1}{marker}",
            size as f64 / level6
        );
    }
}
