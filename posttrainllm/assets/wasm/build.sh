#!/usr/bin/env bash
# Build the WASM trainer into OUT (default wasm/dist): `make wasm` runs this.
# Six builds of the same source: scalar, 128-bit SIMD and SIMD with threads (Emscripten), and
# Memory64, relaxed SIMD and relaxed SIMD with threads (zig, at the end).
#
# Memory is fixed at 64 MB (no growth): with threads, growing memory replaces the buffer that
# every worker's views point at, and a worker that reads through an old view sees garbage — the
# study queue's pthreads x Memory.grow race. Over-allocating once removes it, and with
# ABORTING_MALLOC=0 a model too big for 64 MB gets a clear error from tg_create, not an abort.
#
# `build.sh OUT --names` makes only the relaxed SIMD build, with its function names kept, for
# V8's sampling profiler (benchmarks/wasm.py); the committed builds are stripped.
set -euo pipefail
cd "$(dirname "$0")"
OUT=${1:-dist}
NAMES=${2:-}
mkdir -p "$OUT"
export NODE_PATH=${NODE_PATH:-/usr/share/nodejs}  # Debian's emscripten finds acorn there
API=$(grep -oE '^[a-z].*[ *]tg_[a-z0-9_]+\(' tinygpt.cpp | grep -oE 'tg_[a-z0-9_]+')  # every tg_ function
EXPORTS=$(sed 's/^/_/' <<<"$API" | paste -sd,)
COMMON=(-O3 -std=c++20 -fno-exceptions -fno-rtti
  -sMODULARIZE=1 -sEXPORT_ES6=1 -sEXPORT_NAME=createTinyGPT -sENVIRONMENT=web,worker,node
  -sUSE_ES6_IMPORT_META=0 -sINITIAL_MEMORY=64MB -sALLOW_MEMORY_GROWTH=0 -sABORTING_MALLOC=0
  --extern-pre-js node_shim.js
  "-sEXPORTED_FUNCTIONS=$EXPORTS,_malloc,_free" -sEXPORTED_RUNTIME_METHODS=UTF8ToString)
if [[ -z $NAMES ]]; then
emcc "${COMMON[@]}" tinygpt.cpp -o "$OUT/tinygpt-scalar.mjs"
emcc "${COMMON[@]}" -msimd128 tinygpt.cpp -o "$OUT/tinygpt-simd.mjs"
# the pool's workers are started with the module (a worker cannot start one synchronously
# later); the caller is one of the `threads`, so it needs threads - 1 more. At least one: this
# Emscripten's startup never finishes with an empty pool (node exits with an unsettled await).
emcc "${COMMON[@]}" -msimd128 -pthread -DTINYGPT_THREADS '-sPTHREAD_POOL_SIZE=Math.max(1,(Module.threads|0)-1)' \
  tinygpt.cpp -o "$OUT/tinygpt-threads.mjs"
fi

# Three builds with zig's clang (PyPI's ziglang, installed with the project's test extras), for a
# freestanding target: no libc, so the few libc and C++ pieces the trainer uses come from
# freestanding/.
ZIG=(${PYTHON:-python3} -m ziglang)
FREESTANDING=(-O3 -std=c++20 -fno-exceptions -fno-rtti -msimd128 -mbulk-memory -nostdinc++ -nostdlib++
  -isystem freestanding -Wl,--no-entry $([[ -n $NAMES ]] || echo -Wl,--strip-all) $(sed 's/^/-Wl,--export=/' <<<"$API")
  -Wl,--export=malloc -Wl,--export=free tinygpt.cpp freestanding/runtime.cpp)
# Relaxed SIMD: the matmul's multiply-adds become f32x4.relaxed_madd, which the engine turns into
# the CPU's fused multiply-add. Emscripten 3.1.6's clang predates the opcodes browsers shipped, so
# zig's clang builds it too, for wasm32, with freestanding_loader.mjs as its JavaScript. Memory
# grows on demand up to 1 GB, so a model too big for that gets tg_create's error. No other
# multiply-add is fused (-ffp-contract=off): the compiler would fuse those in a loop's vector body
# and not in its scalar tail, and where a thread's rows end would then change the numbers.
RELAXED=(--target=wasm32-freestanding -mrelaxed-simd -ffp-contract=off)
"${ZIG[@]}" c++ "${RELAXED[@]}" -Wl,--max-memory=1073741824 "${FREESTANDING[@]}" \
  -o "$OUT/tinygpt-relaxed.wasm"
sed 's/@WASM@/tinygpt-relaxed.wasm/' freestanding_loader.mjs > "$OUT/tinygpt-relaxed.mjs"
[[ -z $NAMES ]] || exit 0
# Memory64 (64-bit pointers: no 4 GB ceiling on the model), SIMD, one thread: Debian's Emscripten
# 3.1.6 cannot produce a working one. It runs in wasmtime (the tests) and in browsers with
# Memory64; node 20 cannot load it.
"${ZIG[@]}" c++ --target=wasm64-freestanding "${FREESTANDING[@]}" -o "$OUT/tinygpt64.wasm"
# Relaxed SIMD with threads: shared, imported memory (the loader makes it: 16 MB, growing to 1 GB,
# as for the relaxed build), atomics, and a pool whose Web Workers the loader starts (pool.h,
# TINYGPT_WORKERS); each worker moves its stack with tg_set_stack (freestanding/stack.S).
"${ZIG[@]}" c++ "${RELAXED[@]}" -matomics -DTINYGPT_WORKERS -Wl,--import-memory \
  -Wl,--shared-memory -Wl,--initial-memory=16777216 -Wl,--max-memory=1073741824 -Wl,--export=tg_worker_join \
  -Wl,--export=tg_worker_serve -Wl,--export=tg_set_stack "${FREESTANDING[@]}" freestanding/stack.S \
  -o "$OUT/tinygpt-relaxed-threads.wasm"
sed 's/@WASM@/tinygpt-relaxed-threads.wasm/' freestanding_loader.mjs > "$OUT/tinygpt-relaxed-threads.mjs"
cp freestanding_worker.mjs "$OUT/"
