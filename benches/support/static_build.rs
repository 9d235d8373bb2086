//! The crate's binaries built statically linked, as the README's Install
//! section builds them, in a target directory of their own.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The README's flags for a static build: glibc linked in, and code at
/// fixed addresses, so that no process spends its start relocating itself.
pub const STATIC_RUSTFLAGS: [&str; 4] = [
    "-C",
    "target-feature=+crt-static",
    "-C",
    "relocation-model=static",
];

/// Where the static build goes, apart from the bench's own target directory.
const STATIC_TARGET_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/target/static");

/// Builds every binary of the package statically linked, as `cargo build`
/// would with RUSTFLAGS set to [`STATIC_RUSTFLAGS`] and an explicit
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
        .env("RUSTFLAGS", STATIC_RUSTFLAGS.join(" "))
        .status()
        .expect("cargo runs");
    assert!(built.success(), "the static build failed");
    Path::new(STATIC_TARGET_DIR).join(target).join("release")
}
