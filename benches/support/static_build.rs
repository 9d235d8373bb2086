//! The crate's binaries built statically linked against musl, as the
//! README's Install section builds them, in a target directory of their
//! own; and the no-op delegate the benches measure against.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The target of the static build: musl, whose start-up asks the CPU
/// nothing, where glibc's asks it dozens of questions (CPUID), each a trap
/// to the hypervisor on a virtual machine (docs/performance.md).
pub const STATIC_TARGET: &str = "x86_64-unknown-linux-musl";

/// The README's flags for a static build: the C library linked in, and
/// code at fixed addresses, so that no process spends its start
/// relocating itself.
pub const STATIC_RUSTFLAGS: [&str; 4] = [
    "-C",
    "target-feature=+crt-static",
    "-C",
    "relocation-model=static",
];

/// Where the static build goes, apart from the bench's own target directory.
const STATIC_TARGET_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/target/static");

/// Builds every binary of the package statically linked, as `cargo build`
/// would with RUSTFLAGS set to [`STATIC_RUSTFLAGS`] and `--target`
/// [`STATIC_TARGET`]: the directory they are in.
pub fn build_static() -> PathBuf {
    let built = Command::new(option_env!("CARGO").unwrap_or("cargo"))
        .args([
            "build",
            "--quiet",
            "--release",
            "--locked",
            "--bins",
            "--target",
            STATIC_TARGET,
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("CARGO_TARGET_DIR", STATIC_TARGET_DIR)
        .env("RUSTFLAGS", STATIC_RUSTFLAGS.join(" "))
        .status()
        .expect("cargo runs");
    assert!(
        built.success(),
        "the static build failed: it needs `rustup target add {STATIC_TARGET}` and \
         Debian's musl-tools (./.ci/test installs both)"
    );
    Path::new(STATIC_TARGET_DIR)
        .join(STATIC_TARGET)
        .join("release")
}

/// Builds fixtures/noop-delegate.c, statically linked by C compiler
/// `cc` (`gcc`, against glibc, as C programs usually are; `musl-gcc`),
/// and installs it in `dir`: its path there.
#[allow(dead_code)] // The packaging tests, which share this file, need no no-op.
pub fn build_noop(dir: &Path, cc: &str) -> PathBuf {
    let build = dir.join("build");
    std::fs::create_dir_all(&build).expect("build directory");
    let name = format!("noop-delegate-{cc}");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/noop-delegate.c");
    let built = Command::new(cc)
        .args(["-O2", "-static", "-o"])
        .arg(build.join(&name))
        .arg(source)
        .status()
        .unwrap_or_else(|e| panic!("{cc} runs (gcc: libc6-dev; musl-gcc: musl-tools): {e}"));
    assert!(built.success(), "{cc} -O2 -static failed");
    // A copy, as an installation makes: see benches/overhead.rs's install.
    let installed = dir.join(&name);
    std::fs::copy(build.join(&name), &installed).expect("install the no-op");
    installed
}
