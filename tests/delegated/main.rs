//! ipam-delegated through its built binary, with scripted delegates and
//! Debian's plugins: the chain (the original README's example flow, every
//! way a delegate can fail, rollback, results threaded through), bad
//! input, a stack that hangs, dies or names the plugin itself, GC and
//! STATUS, logging, agent mode, the doctor and the command line.

// The harness every test binary and the pools bench share: each uses
// the part it needs.
#[allow(dead_code)]
#[path = "../common/mod.rs"]
mod common;

// Agent mode's tests, and the harness they and the command line's share.
mod agent;
mod agent_harness;
mod chain;
mod cli;
mod doctor;
mod gc_status;
mod hardening;
mod input;
mod logging;
