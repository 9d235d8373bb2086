#!/usr/bin/env bash
# Runs each fuzz target for SECONDS (default 600), one after the other,
# seeded from fixtures/. Not part of the test suite. Needs cargo-fuzz
# (cargo install cargo-fuzz); the stable toolchain is told to allow the
# nightly flags it uses. Crashes land in fuzz/artifacts/TARGET/.
set -euo pipefail
cd "$(dirname "$0")"
seconds=${1:-600}
export RUSTC_BOOTSTRAP=1

mkdir -p corpus/config corpus/environment corpus/delegate_output
cp ../fixtures/conflists/*.conflist corpus/config/
printf '%s' '{"cniVersion":"1.0.0","name":"n","ipam":{"delegates":["a","b"],"timeout":2}}' >corpus/config/minimal
printf 'ADD\nctr-1\n/var/run/netns/x\neth0\n/opt/cni/bin:/usr/lib/cni\nK=V\n' >corpus/environment/add
printf 'DEL\nctr-1\n\neth0\n/opt/cni/bin\n' >corpus/environment/del
printf '\0\0\0\0{"cniVersion":"1.0.0","ips":[]}' >corpus/delegate_output/success
printf '\0\1\0\0{"code":11,"msg":"later","details":"x"}' >corpus/delegate_output/error
printf '\x09\0\0\0' >corpus/delegate_output/killed

for target in config environment delegate_output; do
  echo "== $target for ${seconds}s"
  cargo fuzz run "$target" "corpus/$target" -- -max_total_time="$seconds" -max_len=65536
done
