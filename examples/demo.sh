#!/usr/bin/env bash
# demo.sh: judges the example traces, one aligned case and several that are not.
# Usage: demo.sh NUMALIGN_BINARY TRACE_DIR. Exit 1 of a judgement is expected and shown.
set -u
cli=$1
dir=$2
run() {
  echo
  echo "\$ numalign $*"
  "$cli" "$@"
  echo "(exit code $?)"
}
echo "== A bf16 / fp32 matmul: a legitimate reordering of the sum is aligned"
run judge "$dir/matmul/reordered.safetensors" "$dir/matmul/ref.safetensors" "$dir/matmul/truth.safetensors"
echo
echo "== The same matmul with one reduction column dropped is not"
run judge "$dir/matmul/dropped_column.safetensors" "$dir/matmul/ref.safetensors" "$dir/matmul/truth.safetensors"
echo
echo "== Fused allreduce + residual (bf16): rounds once, so it is MORE accurate than the reference"
run judge "$dir/allreduce/fused.safetensors" "$dir/allreduce/unfused.safetensors" "$dir/allreduce/truth.safetensors"
echo
echo "== ... while the old absolute bound abs:0.13 falsely fails it at larger magnitudes"
run judge "$dir/allreduce/fused.safetensors" "$dir/allreduce/unfused.safetensors" --rule abs:0.13
echo
echo "== A variant that truncates instead of rounding: only the bias check catches it"
run judge "$dir/allreduce/truncating.safetensors" "$dir/allreduce/unfused.safetensors" \
  "$dir/allreduce/truth.safetensors" --check-bias
exit 0
