//! The crate's binaries built statically linked, as the README's Install
//! section builds them, in a target directory of their own.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Where the static build goes, apart from the bench's own target directory.
const STATIC_TARGET_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/target/static");

/// Builds every binary of the package statically linked, as `cargo build`
/// would with RUSTFLAGS="-C target-feature=+crt-static" and an explicit
/// --target (so that proc-macros stay dynamic): the directory they are in.
pub fn build_static() -> PathBuf {
    let target = "x86_64-unknown-linux-gnu";
    let built = Command::new(option_env!("CARGO").unwrap_or("cargo"))
        .args([
            "build",
            "--quiet",
            "--release",
            "--locked",
            "--bins",
            "--target",
            target,
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("CARGO_TARGET_DIR", STATIC_TARGET_DIR)
        .env("RUSTFLAGS", "-C target-feature=+crt-static")
        .status()
        .expect("cargo runs");
    assert!(built.success(), "the static build failed");
    Path::new(STATIC_TARGET_DIR).join(target).join("release")
}
