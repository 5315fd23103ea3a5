#!/usr/bin/env bash
# Build the WASM trainer into OUT (default wasm/dist): `make wasm` runs this.
# Four builds of the same source: scalar, 128-bit SIMD and SIMD with threads (Emscripten), and
# Memory64 (zig, at the end).
#
# Memory is fixed at 64 MB (no growth): with threads, growing memory replaces the buffer that
# every worker's views point at, and a worker that reads through an old view sees garbage — the
# study queue's pthreads x Memory.grow race. Over-allocating once removes it, and with
# ABORTING_MALLOC=0 a model too big for 64 MB gets a clear error from tg_create, not an abort.
set -euo pipefail
cd "$(dirname "$0")"
OUT=${1:-dist}
mkdir -p "$OUT"
export NODE_PATH=${NODE_PATH:-/usr/share/nodejs}  # Debian's emscripten finds acorn there
API=$(grep -oE '^[a-z].*[ *]tg_[a-z0-9_]+\(' tinygpt.cpp | grep -oE 'tg_[a-z0-9_]+')  # every tg_ function
EXPORTS=$(sed 's/^/_/' <<<"$API" | paste -sd,)
COMMON=(-O3 -std=c++20 -fno-exceptions -fno-rtti
  -sMODULARIZE=1 -sEXPORT_ES6=1 -sEXPORT_NAME=createTinyGPT -sENVIRONMENT=web,worker,node
  -sUSE_ES6_IMPORT_META=0 -sINITIAL_MEMORY=64MB -sALLOW_MEMORY_GROWTH=0 -sABORTING_MALLOC=0
  --extern-pre-js node_shim.js
  "-sEXPORTED_FUNCTIONS=$EXPORTS,_malloc,_free" -sEXPORTED_RUNTIME_METHODS=UTF8ToString)
emcc "${COMMON[@]}" tinygpt.cpp -o "$OUT/tinygpt-scalar.mjs"
emcc "${COMMON[@]}" -msimd128 tinygpt.cpp -o "$OUT/tinygpt-simd.mjs"
# the pool's workers are started with the module (a worker cannot start one synchronously
# later); the caller is one of the `threads`, so it needs threads - 1 more. At least one: this
# Emscripten's startup never finishes with an empty pool (node exits with an unsettled await).
emcc "${COMMON[@]}" -msimd128 -pthread -DTINYGPT_THREADS '-sPTHREAD_POOL_SIZE=Math.max(1,(Module.threads|0)-1)' \
  tinygpt.cpp -o "$OUT/tinygpt-threads.mjs"

# Memory64 (64-bit pointers: no 4 GB ceiling on the model), SIMD, one thread. Debian's
# Emscripten 3.1.6 cannot produce a working one, so zig's clang builds it (PyPI's ziglang,
# installed with the project's test extras) for wasm64-freestanding: no libc, so the few libc
# and C++ pieces the trainer uses come from freestanding/. It runs in wasmtime (the tests) and
# in browsers with Memory64; node 20 cannot load it.
ZIG=(${PYTHON:-python3} -m ziglang)
"${ZIG[@]}" c++ --target=wasm64-freestanding -O3 -std=c++20 -fno-exceptions -fno-rtti -msimd128 \
  -mbulk-memory -nostdinc++ -nostdlib++ -isystem freestanding -Wl,--no-entry -Wl,--strip-all \
  $(sed 's/^/-Wl,--export=/' <<<"$API") \
  -Wl,--export=malloc -Wl,--export=free tinygpt.cpp freestanding/runtime.cpp -o "$OUT/tinygpt64.wasm"
