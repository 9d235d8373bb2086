//! The static plugin's size: every pod start maps it, so it stays within
//! 1.5 MiB stripped, however the rest of the package grows.

use crate::static_build;

/// 1.5 MiB.
const LIMIT: u64 = 3 << 19;

#[test]
#[ignore = "needs a static release build of its own (a few minutes)"]
fn the_static_plugin_stays_within_1_5_mib() {
    let plugin = static_build::build_static().join("ipam-delegated");
    let size = std::fs::metadata(&plugin).unwrap().len();
    assert!(
        size <= LIMIT,
        "{} is {size} bytes, over {LIMIT}: see docs/performance.md for what each part costs",
        plugin.display()
    );
}
