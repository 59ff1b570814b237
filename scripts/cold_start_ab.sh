#!/usr/bin/env bash
# Start-up of `eagle-trt run` for two checkouts side by side, each with its own warm weight cache:
#   scripts/cold_start_ab.sh ENGINE CHECKOUT_A CHECKOUT_B [REPEATS]
# Prints each side's first run (it makes the layouts; kernels compiled beforehand, untimed), then REPEATS warm
# runs alternated A B A B (wall seconds of the whole process).
set -euo pipefail
engine=$1; a=$2; b=$3; repeats=${4:-5}
py=${PYTHON:-python}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
one() {  # side dir cache
  local s e
  s=$(date +%s.%N)
  EAGLE_TRT_WEIGHT_CACHE=$3 PYTHONPATH=$2 "$py" -m eagle_trt run --engine "$engine" --prompt hi \
    --max-new-tokens 4 --json > /dev/null
  e=$(date +%s.%N)
  echo "$1 $(echo "$e - $s" | bc)"
}
for side in A B; do
  src=$a; [ "$side" = B ] && src=$b
  install -d -m 700 "$work/pre-$side" "$work/$side"
  one "$side-compile" "$src" "$work/pre-$side" > /dev/null
  one "$side first" "$src" "$work/$side"
done
for _ in $(seq "$repeats"); do
  one "A warm" "$a" "$work/A"
  one "B warm" "$b" "$work/B"
done
